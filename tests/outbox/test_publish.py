"""publish(): in the caller's transaction, as the caller's tenant, or not at all."""

from __future__ import annotations

import datetime
import decimal
import os
import subprocess
import sys
import uuid

import psycopg
import pytest

from outbox import publish
from outbox.models import OutboxMessage
from outbox.publishing import NoTenant, NotInTransaction, wake_up
from tenancy import tenant_context
from tests.helpers import (
    app_atomic,
    app_connection,
    as_tenant,
    connect,
    count_rows,
    observer,
    raises_rls_violation,
)
from tests.outbox.support.helpers import ROOT, publish_as, raw_publish
from tests.testapp.models import Order

# make test-variants runs the tests marked `variants` again: those that send a statement
# through the library's aliases, which a deployment variant can change (docs/contributing.md).

A, B = 1, 2


def test_publish_outside_a_transaction_raises_and_writes_nothing():
    with pytest.raises(NotInTransaction, match="transaction.atomic"):
        publish("order.placed", {"sku": "x"})
    assert count_rows("outbox_messages") == 0


def test_publish_without_a_tenant_raises():
    with pytest.raises(NoTenant, match="tenant_context"), app_atomic():
        publish("order.placed", {"sku": "x"})
    assert count_rows("outbox_messages") == 0


@pytest.mark.variants
def test_publish_rejects_an_empty_topic():
    with pytest.raises(ValueError, match="topic"), tenant_context(A):
        publish("", {})


@pytest.mark.variants
def test_the_message_commits_with_the_change_it_announces():
    with tenant_context(A):
        order = Order.objects.create(tenant_id=A, sku="a-1")
        message_id = publish(
            "order.placed", {"id": order.pk, "total": decimal.Decimal("9.50"),
                             "at": datetime.date(2026, 1, 2)},
            key=f"order:{order.pk}", aggregate_type="order", aggregate_id=order.pk,
            headers={"trace": "t-1"},
        )
        with app_connection().cursor() as cursor:
            cursor.execute("SELECT pg_current_xact_id()::text::bigint")
            xid = cursor.fetchone()[0]
    with tenant_context(A):
        row = OutboxMessage.objects.get()
    assert row.message_id == message_id
    assert row.tenant_id == A
    assert row.xid == xid  # the writing transaction's id
    assert row.payload == {"id": order.pk, "total": "9.50", "at": "2026-01-02"}
    assert (row.key, row.aggregate_type, row.aggregate_id) == (f"order:{order.pk}", "order",
                                                                str(order.pk))
    assert row.headers == {"trace": "t-1"}
    assert row.created_at is not None


@pytest.mark.variants
def test_a_rolled_back_change_publishes_nothing():
    with pytest.raises(RuntimeError), tenant_context(A):
        Order.objects.create(tenant_id=A, sku="a-1")
        publish("order.placed", {"sku": "a-1"})
        raise RuntimeError("the order failed")
    assert count_rows("outbox_messages") == 0


@pytest.mark.variants
def test_a_rolled_back_savepoint_takes_its_message_with_it():
    with tenant_context(A):
        kept = publish("order.placed", {"sku": "kept"})
        try:
            with app_atomic():
                publish("order.placed", {"sku": "dropped"})
                raise RuntimeError
        except RuntimeError:
            pass
    with observer() as conn:
        ids = [r[0] for r in conn.execute("SELECT message_id FROM outbox_messages")]
    assert ids == [kept]


@pytest.mark.variants
def test_commit_wakes_the_relay_once_and_rollback_does_not():
    wake_up.clear()
    with pytest.raises(RuntimeError), tenant_context(A):
        publish("order.placed", {})
        raise RuntimeError
    assert not wake_up.is_set()
    with tenant_context(A):
        publish("order.placed", {})
        publish("order.placed", {})
        hooks = [h for h in app_connection().run_on_commit if h[1].__name__ == "_kick"]
        assert len(hooks) == 1
        assert not wake_up.is_set()
    assert wake_up.is_set()


@pytest.mark.variants
def test_on_commit_hook_setting_is_called_after_commit(settings):
    calls = []
    settings.OUTBOX = {**settings.OUTBOX, "ON_COMMIT": lambda: calls.append(1)}
    with tenant_context(A):
        publish("order.placed", {})
        assert calls == []
    assert calls == [1]


@pytest.mark.variants
def test_message_id_can_be_given():
    given = uuid.uuid4()
    assert publish_as(A, "order.placed", {}, message_id=given) == given


@pytest.mark.variants
def test_a_tenant_never_sees_another_tenants_messages():
    publish_as(A, "order.placed", {"sku": "a"})
    publish_as(B, "order.placed", {"sku": "b"})
    with tenant_context(B):
        assert [m.payload["sku"] for m in OutboxMessage.objects.all()] == ["b"]
    with connect() as conn, as_tenant(conn, B) as cursor:
        cursor.execute("SELECT tenant_id FROM outbox_messages")
        assert cursor.fetchall() == [(B,)]
    with app_atomic():
        assert OutboxMessage.objects.count() == 0  # no tenant: nothing


def test_a_tenant_cannot_publish_as_another():
    with connect() as conn, raises_rls_violation(), as_tenant(conn, B) as cursor:
        cursor.execute(
            "INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
            " VALUES (%s, gen_random_uuid(), 't', '{}')", [A]
        )


@pytest.mark.variants
def test_messages_are_append_only_for_the_app_role():
    publish_as(A, "order.placed", {})
    for statement in ("UPDATE outbox_messages SET topic = 'x'", "DELETE FROM outbox_messages"):
        with connect() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege), \
                as_tenant(conn, A) as cursor:
            cursor.execute(statement)
    assert count_rows("outbox_messages", "topic = 'order.placed'") == 1


def test_xid_is_the_top_level_transaction_even_inside_savepoints():
    with connect() as conn, conn.transaction():
        raw_publish(conn, A, "t", {})
        with conn.transaction():  # a savepoint
            raw_publish(conn, A, "t", {})
        xid = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
    with observer() as conn:
        xids = {r[0] for r in conn.execute("SELECT xid::text::bigint FROM outbox_messages")}
    assert xids == {xid}


def test_publish_and_receiver_can_be_imported_before_the_app_registry_is_ready():
    """E.g. at the top of an app's apps.py: nothing on the way imports the models."""
    code = "from outbox import publish, receiver; publish, receiver"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
