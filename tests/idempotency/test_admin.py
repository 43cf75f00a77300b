"""The read-only admin list of keys, across tenants, with its filters."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db.models.functions import Now
from django.test import Client

from tenancy import tenant_context
from tests.helpers import observer
from tests.idempotency.factories import KeyFactory, PendingKeyFactory

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
    with tenant_context(1):
        KeyFactory(key="done-a", request_path="/o")
        PendingKeyFactory(key="stuck-a", request_path="/p",
                          created_at=Now() - timedelta(hours=3))
    with tenant_context(2):
        KeyFactory(key="done-b", request_path="/o", created_at=Now() - timedelta(days=2),
                   expires_at=Now() - timedelta(days=1))
        PendingKeyFactory(key="running-b", request_path="/p",
                          created_at=Now() - timedelta(hours=3),
                          locked_until=Now() + timedelta(minutes=1))


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
