"""The outbox admin: parked messages listed across tenants, filtered, re-driven and
discarded after a confirmation; reader positions read-only."""

from __future__ import annotations

import json
import uuid

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from outbox.consumers import ensure_offsets
from tests.helpers import count_rows, observer
from tests.outbox.support.helpers import publish_as
from tests.outbox.support.recorders import OrderRecorder

PARKED = "/admin/outbox/parkedmessagerecord/"
POSITIONS = "/admin/outbox/readerpositionrecord/"


@pytest.fixture
def staff():
    user = User.objects.create_superuser("ops", "ops@example.com", "pw")
    client = Client()
    client.force_login(user)
    yield client
    User.objects.all().delete()


def park(tenant: int, consumer: str, topic: str, payload: dict) -> int:
    with observer() as conn:
        return conn.execute(
            """
            INSERT INTO outbox_dead_letters (tenant_id, consumer, message_pk, message_id, topic,
                   key, payload, headers, message_created_at, attempts, error)
            VALUES (%s, %s, 1, %s, %s, %s, %s::jsonb, '{}'::jsonb, now(), 5,
                    E'Traceback...\\nBoom: it failed')
            RETURNING id
            """,
            [tenant, consumer, uuid.uuid4(), topic, f"key-{payload['sku']}", json.dumps(payload)],
        ).fetchone()[0]


@pytest.fixture
def parked():
    return {
        "fixable": park(1, "orders", "order.placed", {"sku": "fixable"}),
        "poison": park(2, "orders", "order.placed", {"sku": "poison", "poison": True}),
        "other": park(2, "orders-slow", "order.slow", {"sku": "other"}),
    }


def listed(client, query: str = "") -> set[str]:
    response = client.get(PARKED + query)
    assert response.status_code == 200
    text = response.content.decode()
    return {sku for sku in ("fixable", "poison", "other") if f"key-{sku}" in text}


def remaining() -> set[str]:
    with observer() as conn:
        return {r[0] for r in conn.execute("SELECT payload->>'sku' FROM outbox_dead_letters")}


def act(client, action: str, ids: list[int], confirmed: bool):
    data = {"action": action, "_selected_action": [str(i) for i in ids]}
    if confirmed:
        data["confirmed"] = "yes"
    return client.post(PARKED, data)


def test_every_tenants_parked_messages_are_listed_and_filtered(staff, parked):
    assert listed(staff) == {"fixable", "poison", "other"}
    assert listed(staff, "?tenant_id=2") == {"poison", "other"}
    assert listed(staff, "?consumer=orders") == {"fixable", "poison"}
    assert listed(staff, "?topic=order.slow") == {"other"}
    assert listed(staff, "?q=key-poison") == {"poison"}  # searched by key
    with observer() as conn:
        message_id = conn.execute("SELECT message_id FROM outbox_dead_letters WHERE id = %s",
                                  [parked["fixable"]]).fetchone()[0]
    assert listed(staff, f"?q={message_id}") == {"fixable"}  # and by message id
    assert "Boom: it failed" in staff.get(PARKED).content.decode()  # the last error line


def test_redrive_asks_first_then_handles_as_the_tenant(staff, parked):
    response = act(staff, "redrive_selected", [parked["fixable"], parked["poison"]], False)
    assert response.status_code == 200
    page = response.content.decode()
    assert "Re-drive 2 parked message(s)?" in page and "Yes, re-drive them" in page
    assert remaining() == {"fixable", "poison", "other"}  # nothing done yet
    assert count_rows("testapp_order") == 0

    response = act(staff, "redrive_selected", [parked["fixable"], parked["poison"]], True)
    assert response.status_code == 302
    assert remaining() == {"poison", "other"}  # the poison message failed again
    assert count_rows("testapp_order", "tenant_id = 1 AND sku = 'fixable'") == 1
    with observer() as conn:
        assert conn.execute("SELECT attempts FROM outbox_dead_letters WHERE id = %s",
                            [parked["poison"]]).fetchone()[0] == 6
    message = staff.get(PARKED).content.decode()
    assert "Re-driven: 1 handled, 1 failed again" in message


def test_discard_asks_first_then_deletes_unhandled(staff, parked):
    response = act(staff, "discard_selected", [parked["other"]], False)
    assert response.status_code == 200
    assert "cannot be undone" in response.content.decode()
    assert remaining() == {"fixable", "poison", "other"}
    assert act(staff, "discard_selected", [parked["other"]], True).status_code == 302
    assert remaining() == {"fixable", "poison"}
    assert count_rows("testapp_order") == 0


def test_django_delete_selected_is_not_offered(staff, parked):
    page = staff.get(PARKED).content.decode()
    assert "delete_selected" not in page
    assert "redrive_selected" in page and "discard_selected" in page


def test_a_non_staff_user_is_refused(parked):
    user = User.objects.create_user("visitor", password="pw")
    client = Client()
    client.force_login(user)
    try:
        response = client.get(PARKED)
        assert response.status_code == 302 and "/login/" in response["Location"]
        act(client, "discard_selected", [parked["other"]], True)
        assert remaining() == {"fixable", "poison", "other"}
    finally:
        User.objects.all().delete()


def test_staff_who_may_only_view_cannot_act(parked):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_parkedmessagerecord"))
    client = Client()
    client.force_login(user)
    try:
        page = client.get(PARKED).content.decode()
        assert "key-fixable" in page and "discard_selected" not in page
        act(client, "discard_selected", [parked["other"]], True)
        assert remaining() == {"fixable", "poison", "other"}
    finally:
        User.objects.all().delete()


def test_reader_positions_show_lag_and_are_read_only(staff):
    ensure_offsets(OrderRecorder())
    publish_as(1, "order.placed", {"sku": "waiting"})
    response = staff.get(POSITIONS)
    assert response.status_code == 200
    page = response.content.decode()
    assert ">orders<" in page
    assert '<td class="field-behind">1</td>' in page
    assert staff.get(POSITIONS + "add/").status_code == 403
    assert "action-select" not in page  # no actions, nothing to select
