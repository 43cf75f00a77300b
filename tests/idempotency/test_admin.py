"""The read-only admin list of keys, across tenants, with its filters."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.helpers import observer

URL = "/admin/idempotency/idempotencykeyrecord/"


@pytest.fixture
def staff():
    user = User.objects.create_superuser("ops", "ops@example.com", "pw")
    client = Client()
    client.force_login(user)
    yield client
    User.objects.all().delete()


@pytest.fixture
def keys():
    with observer() as conn:
        conn.execute(
            """
            INSERT INTO idempotency_keys (tenant_id, scope, key, request_hash, request_method,
                   request_path, state, status_code, created_at, expires_at, locked_until)
            VALUES (1, 'order.create', 'done-a', 'h', 'POST', '/o', 'completed', 201,
                    now(), now() + interval '1 day', NULL),
                   (2, 'order.create', 'done-b', 'h', 'POST', '/o', 'completed', 201,
                    now() - interval '2 days', now() - interval '1 day', NULL),
                   (1, 'payment.capture', 'stuck-a', 'h', 'POST', '/p', 'pending', NULL,
                    now() - interval '3 hours', now() + interval '1 day', NULL),
                   (2, 'payment.capture', 'running-b', 'h', 'POST', '/p', 'pending', NULL,
                    now() - interval '3 hours', now() + interval '1 day',
                    now() + interval '1 minute')
            """
        )


def listed(client, query=""):
    response = client.get(URL + query)
    assert response.status_code == 200
    text = response.content.decode()
    return {k for k in ("done-a", "done-b", "stuck-a", "running-b") if f">{k}<" in text}


def test_the_list_shows_every_tenant(staff, keys):
    assert listed(staff) == {"done-a", "done-b", "stuck-a", "running-b"}


def test_filters_for_state_stuck_and_expired(staff, keys):
    assert listed(staff, "?state=pending") == {"stuck-a", "running-b"}
    assert listed(staff, "?stuck=yes") == {"stuck-a"}  # running-b holds a live lease
    assert listed(staff, "?expired=yes") == {"done-b"}


def test_it_is_read_only(staff, keys):
    assert staff.get(URL + "add/").status_code == 403
    assert staff.post(URL + "done-a/delete/").status_code in (302, 403, 404)
    with observer() as conn:
        assert conn.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0] == 4
