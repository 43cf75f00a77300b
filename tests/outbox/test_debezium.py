"""Debezium carries the outbox: proven with the mechanism it uses (docs/debezium.md).

A slot of PostgreSQL's ``pgoutput`` plugin on the publication that the opt-in
migration creates, read by the connector's role with
``pg_logical_slot_get_binary_changes``: what Debezium's connector streams.
Each decoded insert is shaped as the outbox event router emits it with the
page's connector configuration (tests/outbox/support/event_router.py) and
handed to the library's receivers. No relay runs (``TRANSPORT = None``).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import transaction

from outbox import debezium, publish
from outbox.conf import SigningKey
from outbox.exceptions import BadSignature
from outbox.retention import reap
from outbox.store import read_envelopes
from outbox.stream import Message, Position
from tenancy import tenant_context
from tenancy.aliases import system_alias
from tests.helpers import app_atomic, as_tenant, connect, observer, superuser
from tests.outbox.support.event_router import Record, route
from tests.outbox.support.helpers import effects
from tests.outbox.support.order_worker_app import receive_order
from tests.outbox.support.pgoutput import Transaction, decode

SLOT = "dio_test_outbox"
PUBLICATION = "dio_test_outbox"
ROLE = "dio_outbox_connector"
KEY = "k" * 40
T1, T2 = 1, 2


def test_the_test_cluster_decodes_logically():
    """scripts/services starts the cluster with wal_level = logical (docs/debezium.md)."""
    with observer() as conn:
        assert conn.execute("SHOW wal_level").fetchone()[0] == "logical"


# -- the deployment: the migration's publication, the connector's role and slot -----------


def _ensure_role() -> None:
    with superuser() as conn:
        conn.execute(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN "
            f"CREATE ROLE {ROLE} LOGIN REPLICATION PASSWORD '{ROLE}'; END IF; END $$"
        )


def _owner() -> psycopg.Connection:
    return connect("owner", autocommit=True)


def _connector() -> psycopg.Connection:
    db = django_settings.DATABASES["owner"]
    return psycopg.connect(host=db["HOST"], port=db["PORT"], dbname=db["NAME"], user=ROLE,
                           password=ROLE, autocommit=True)


class Slot:
    """The connector's side: a pgoutput slot it reads (and confirms) through SQL."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def changes(self, *, confirm: bool = True) -> list[Transaction]:
        function = "get" if confirm else "peek"
        rows = self.conn.execute(
            f"SELECT data FROM pg_logical_slot_{function}_binary_changes(%s, NULL, NULL,"
            " 'proto_version', '1', 'publication_names', %s)", [SLOT, PUBLICATION],
        ).fetchall()
        return decode([r[0] for r in rows])

    def records(self, *, confirm: bool = True) -> list[Record]:
        return [route(row) for t in self.changes(confirm=confirm) for table, row in t.inserts
                if table == "public.outbox_messages"]


@contextlib.contextmanager
def deployed() -> Iterator[Slot]:
    """The opt-in migration's SQL applied as the owner and the connector's slot; undone after."""
    _ensure_role()
    with _owner() as owner:
        owner.execute(debezium.forward_sql(PUBLICATION, ROLE))
        try:
            with _connector() as conn:
                conn.execute("SET TimeZone = 'UTC'")
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [SLOT])
                try:
                    yield Slot(conn)
                finally:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", [SLOT])
        finally:
            owner.execute(debezium.reverse_sql(PUBLICATION, ROLE))


@pytest.fixture
def relay_less(settings):
    settings.OUTBOX = {**settings.OUTBOX, "CONSUMERS": [], "TRANSPORT": None,
                       "REPLICATION_SLOT": SLOT}


@pytest.fixture
def signed(settings, relay_less):
    settings.OUTBOX = {**settings.OUTBOX, "SIGNING_KEYS": [KEY]}


@pytest.fixture
def slot(relay_less) -> Iterator[Slot]:
    with deployed() as opened:
        yield opened


def _message_ids(records: list[Record]) -> list[str]:
    return [dict(r.headers)["id"].decode() for r in records]  # type: ignore[union-attr]


def _insert(conn: psycopg.Connection, tenant_id: int, payload: dict[str, Any]) -> str:
    """The row publish() writes, on a raw app-role session (two transactions open at once)."""
    message_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO outbox_messages (tenant_id, message_id, topic, key, aggregate_type,"
        " aggregate_id, payload) VALUES (%s, %s, 'order.placed', %s, 'order', %s, %s::jsonb)",
        [tenant_id, message_id, f"order:{payload['n']}", str(payload["n"]), json.dumps(payload)],
    )
    return message_id


# -- delivery: every committed message once, in commit order ------------------------


def test_every_committed_message_is_decoded_once_in_commit_order_and_no_rolled_back_one(slot):
    with connect() as first, connect() as second, connect() as third:
        # Tenant 1 publishes first and commits last; tenant 2 commits in between.
        with as_tenant(first, T1):
            late = [_insert(first, T1, {"n": 1})]
            with as_tenant(second, T2):
                middle = [_insert(second, T2, {"n": 2})]
                # A transaction of tenant 1 with a savepoint rolled back (publish()
                # and Django's atomic()), committed before both.
                with tenant_context(T1), app_atomic():
                    with contextlib.suppress(RuntimeError), transaction.atomic():
                        publish("order.placed", {"n": 3}, key="order:3",
                                aggregate_type="order")
                        raise RuntimeError("the savepoint rolls back")
                    early = [str(publish("order.placed", {"n": 4}, key="order:4",
                                         aggregate_type="order"))]
                # A whole transaction rolled back.
                with contextlib.suppress(RuntimeError), as_tenant(third, T2):
                    _insert(third, T2, {"n": 5})
                    raise RuntimeError("rolled back")
            late.append(_insert(first, T1, {"n": 6}))

    transactions = slot.changes()
    decoded = [[route(row) for _, row in t.inserts] for t in transactions]
    assert [_message_ids(t) for t in decoded] == [early, middle, late]
    assert [t.commit_lsn for t in transactions] == sorted(t.commit_lsn for t in transactions)
    # Each once, and never again once confirmed.
    assert slot.changes() == []
    with observer() as conn:
        assert conn.execute("SELECT count(*) FROM consumer_offsets").fetchone()[0] == 0


def test_a_relay_less_deployment_delivers_each_decoded_message_to_its_receiver_once(slot, signed):
    for tenant in (T1, T2, T1):
        with tenant_context(tenant), app_atomic():
            publish("order.placed", {"sku": f"t{tenant}"}, key=f"order:{tenant}",
                    aggregate_type="order")
    records = slot.records()
    assert len(records) == 3
    # Debezium replays from its last flushed position after a crash: every
    # record twice.
    for record in records + records:
        receive_order(debezium.message_from_record(record.value, record.headers, record.key))
    assert sorted(effects().values()) == [1, 1, 1]
    with observer() as conn:
        rows = conn.execute("SELECT tenant_id, sku FROM testapp_order ORDER BY id").fetchall()
        received = conn.execute(
            "SELECT tenant_id, count(*) FROM outbox_received GROUP BY 1 ORDER BY 1").fetchall()
    assert rows == [(T1, "t1"), (T2, "t2"), (T1, "t1")]
    assert received == [(T1, 2), (T2, 1)]


# -- the record is the relay's envelope -------------------------------------------------

PAYLOAD = {
    "total": Decimal("10.10"), "note": "naïve ✓", "nested": {"b": [1, 2.5, None], "a": True},
    "big": 1e16, "small": 1e-7, "zero": -0.0, "int": 2**62,
}


def test_a_decoded_record_gives_the_envelope_the_relay_sends(slot):
    with tenant_context(T2), app_atomic():
        publish("order.paid", PAYLOAD, key="order:9", aggregate_type="order", aggregate_id=9,
                headers={"trace": "abc"})
    (record,) = slot.records()
    assert record.topic == "outbox.order" and record.key == b"order:9"
    relayed = read_envelopes(system_alias(), Position(), 10).messages[0]
    assert debezium.envelope_from_record(record.value, record.headers, record.key) == relayed.data()
    # The same Message a receiver gets from the relay's envelope (the xid, for
    # people, is not in the envelope).
    decoded = debezium.message_from_record(record.value, record.headers, record.key)
    assert decoded == Message.from_envelope(relayed.data())


def test_the_publishers_signature_verifies_as_a_receiver_decodes_the_record(slot, signed):
    with tenant_context(T1), app_atomic():
        message_id = publish("order.paid", PAYLOAD, key="order:9", aggregate_type="order",
                             headers={"trace": "abc"})
    (record,) = slot.records()
    headers = json.loads(dict(record.headers)["headers"])  # type: ignore[arg-type]
    assert headers["outbox-signature"].startswith("r1.")
    message = debezium.message_from_record(record.value, record.headers, record.key)
    assert message.message_id == message_id and message.tenant_id == T1
    assert message.headers == {"trace": "abc"}


def _changed(record: Record, name: str, value: bytes | None) -> list[tuple[str, bytes | None]]:
    return [(n, value if n == name else v) for n, v in record.headers]


def test_a_record_changed_on_the_way_is_refused_before_its_receiver_runs(slot, signed, caplog):
    with tenant_context(T1), app_atomic():
        publish("order.paid", {"sku": "x"}, key="order:1", aggregate_type="order")
    (record,) = slot.records()
    headers = json.loads(dict(record.headers)["headers"])  # type: ignore[arg-type]
    unsigned = json.dumps({k: v for k, v in headers.items() if k != "outbox-signature"})
    forged = [
        (record.value, _changed(record, "tenant_id", b"2"), "does not match"),
        (b'{"sku": "y"}', record.headers, "does not match"),
        (record.value, _changed(record, "id", str(uuid.uuid4()).encode()), "does not match"),
        (record.value, _changed(record, "headers", unsigned.encode()), "no publisher's"),
    ]
    for value, changed, why in forged:
        with pytest.raises(BadSignature, match=why):
            receive_order(debezium.message_from_record(value, changed, record.key))
    other = SigningKey.of(b"o" * 40)
    with pytest.raises(BadSignature, match="not in"):
        debezium.verify(debezium.envelope_from_record(record.value, record.headers, record.key)
                        | {"headers": headers}, keys=[other])
    assert effects() == {}
    assert "refused message" in caplog.text and "sku" not in caplog.text
    receive_order(debezium.message_from_record(record.value, record.headers, record.key))
    assert sum(effects().values()) == 1


# -- retention waits for the slot ----------------------------------------------------------


def _age_everything() -> None:
    with observer() as conn:
        conn.execute("UPDATE outbox_messages SET created_at = now() - interval '30 days'")


def _kept() -> list[str]:
    with observer() as conn:
        return [str(r[0]) for r in conn.execute(
            "SELECT message_id FROM outbox_messages ORDER BY id")]


def _confirm_past(slot: Slot) -> list[Record]:
    """Read and confirm, then a checkpoint (it logs the running transactions), read again."""
    records = slot.records()
    with superuser() as conn:
        conn.execute("CHECKPOINT")
    slot.changes()
    return records


def test_retention_waits_for_the_slot_to_confirm_a_message(slot):
    with tenant_context(T1):
        first = [str(publish("order.placed", {"n": 1}, aggregate_type="order"))]
    _age_everything()
    assert len(slot.records(confirm=False)) == 1  # received, not confirmed
    assert reap().messages == 0
    assert _kept() == first
    assert len(_confirm_past(slot)) == 1
    with tenant_context(T2):
        later = [str(publish("order.placed", {"n": 2}, aggregate_type="order"))]
    _age_everything()
    result = reap()
    assert result.messages == 1 and result.slot_horizon is not None
    assert _kept() == later


def test_nothing_is_reaped_while_the_slot_does_not_exist(relay_less, capsys):
    with tenant_context(T1):
        publish("order.placed", {"n": 1}, aggregate_type="order")
    _age_everything()
    assert reap().messages == 0
    call_command("reap_outbox")
    assert f"the replication slot {SLOT} does not exist" in capsys.readouterr().out
    assert len(_kept()) == 1


# -- health ---------------------------------------------------------------------------


def test_a_slot_that_is_missing_or_not_read_is_reported(relay_less):
    assert debezium.slot_problems(system_alias()) == [
        f"replication slot {SLOT}: does not exist in this database (the connector's "
        "slot.name); no message is reaped until it does"]
    with deployed():
        (problem,) = debezium.slot_problems(system_alias())
        assert problem.startswith(f"replication slot {SLOT}: no connector is reading from it")


# -- the opt-in migration -----------------------------------------------------------------


def _migration(capsys) -> Any:
    call_command("outbox_debezium_migration", "testapp", "--publication", PUBLICATION,
                 "--role", ROLE, "--dry-run")
    namespace: dict[str, Any] = {}
    exec(compile(capsys.readouterr().out, "migration", "exec"), namespace)  # noqa: S102
    return namespace["Migration"]


def test_the_migration_creates_an_insert_only_publication_and_rolls_back(capsys):
    _ensure_role()
    migration = _migration(capsys)
    from django.db.migrations.loader import MigrationLoader

    latest = MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes("outbox")
    assert latest[0] in migration.dependencies  # after the outbox's migrations
    (operation,) = migration.operations
    with _owner() as owner:
        owner.execute(operation.sql)
        try:
            published = owner.execute(
                "SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication"
                " WHERE pubname = %s", [PUBLICATION]).fetchone()
            tables = owner.execute("SELECT tablename FROM pg_publication_tables"
                                   " WHERE pubname = %s", [PUBLICATION]).fetchall()
            granted = owner.execute("SELECT has_table_privilege(%s, 'outbox_messages',"
                                    " 'SELECT')", [ROLE]).fetchone()[0]
        finally:
            owner.execute(operation.reverse_sql)
        assert published == (True, False, False, False)
        assert tables == [("outbox_messages",)] and granted
        assert owner.execute("SELECT count(*) FROM pg_publication WHERE pubname = %s",
                             [PUBLICATION]).fetchone()[0] == 0


def test_the_migration_refuses_without_the_connectors_role(capsys):
    call_command("outbox_debezium_migration", "testapp", "--role", "dio_nobody", "--dry-run")
    namespace: dict[str, Any] = {}
    exec(compile(capsys.readouterr().out, "migration", "exec"), namespace)  # noqa: S102
    (operation,) = namespace["Migration"].operations
    with _owner() as owner, pytest.raises(psycopg.errors.RaiseException,
                                          match="dio_nobody .LOGIN REPLICATION. does not exist"):
        owner.execute(operation.sql)


def test_the_command_writes_the_migration_into_the_app(tmp_path, capsys):
    from django.apps import apps

    directory = apps.get_app_config("testapp").path + "/migrations"
    import os

    before = set(os.listdir(directory))
    call_command("outbox_debezium_migration", "testapp")
    written = sorted(set(os.listdir(directory)) - before)
    try:
        assert len(written) == 1 and written[0].endswith("_debezium_outbox.py")
        assert "CREATE PUBLICATION outbox FOR TABLE outbox_messages" in open(
            os.path.join(directory, written[0])).read()
    finally:
        for name in written:
            os.remove(os.path.join(directory, name))
    assert "CREATE ROLE outbox_connector LOGIN REPLICATION" in capsys.readouterr().out
