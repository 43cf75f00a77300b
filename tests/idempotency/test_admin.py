"""The read-only admin list of keys, across tenants, with its filters; each key's page with
its stored answer; counts that do not scan per row; staff confined to tenants."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.db.models.functions import Now
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils.http import urlencode

from tenancy import tenant_context
from tenancy.aliases import admin_alias
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
    return {k for k in ("done-a", "done-b", "stuck-a", "running-b") if f">{k}</a>" in text}


def page(client, tenant, scope, key):
    query = urlencode({"tenant_id": tenant, "scope": scope, "key": key})
    return client.get(f"{URL}key/?{query}")


def test_the_list_shows_every_tenant(staff, keys):
    assert listed(staff) == {"done-a", "done-b", "stuck-a", "running-b"}


def test_filters_for_state_stuck_expired_tenant_and_scope(staff, keys):
    assert listed(staff, "?state=pending") == {"stuck-a", "running-b"}
    assert listed(staff, "?stuck=yes") == {"stuck-a"}  # running-b holds a live lease
    assert listed(staff, "?stuck=no") == {"done-a", "done-b", "running-b"}
    assert listed(staff, "?expired=yes") == {"done-b"}
    assert listed(staff, "?tenant_id=2") == {"done-b", "running-b"}
    assert listed(staff, "?scope=payment.capture") == {"stuck-a", "running-b"}
    assert listed(staff, "?tenant_id=1&scope=payment.capture") == {"stuck-a"}


def test_the_counts_are_one_pass_keyed_by_the_row_not_key_in_a_subquery(staff, keys):
    with tenant_context(2):  # the same key in another tenant: not stuck there
        KeyFactory(key="stuck-a", scope="payment.capture", request_path="/p")
    with CaptureQueriesContext(connections[admin_alias()]) as seen:
        text = staff.get(URL + "?_facets=1").content.decode()
    assert "Stuck unfinished (1)" in text and "Not stuck (4)" in text
    assert "Expired (1)" in text and "Live (4)" in text
    statements = [q["sql"] for q in seen.captured_queries]
    assert not [s for s in statements if "IN (SELECT" in s.upper()], statements
    # No filter lists the table's distinct values (tenant and scope are typed in).
    assert not [s for s in statements if "DISTINCT" in s.upper()], statements


def test_times_are_shown_to_the_second(staff, keys):
    with observer() as conn:
        created = conn.execute("SELECT created_at FROM idempotency_keys WHERE key = 'done-a'"
                               ).fetchone()[0]
    assert created.strftime("%Y-%m-%d %H:%M:%S") in staff.get(URL).content.decode()


def test_a_keys_page_shows_its_stored_answer(staff, keys):
    with tenant_context(1):
        KeyFactory(key="answered", response=b'{"id":42,"sku":"abc"}',
                   response_headers=[["Content-Type", "application/json"],
                                     ["Location", "/orders/42/"]])
    text = page(staff, 1, "order.create", "answered").content.decode()
    assert '<td id="status">201</td>' in text
    assert "Location" in text and "/orders/42/" in text
    assert '&quot;id&quot;: 42,\n  &quot;sku&quot;: &quot;abc&quot;' in text  # indented JSON
    text = page(staff, 1, "payment.capture", "stuck-a").content.decode()
    assert "None yet: the request has not finished." in text and "payment_created" in text
    assert page(staff, 2, "order.create", "answered").status_code == 404  # key + scope + tenant
    assert f'href="{URL}key/?tenant_id=1&amp;scope=order.create&amp;key=answered"' in (
        staff.get(URL).content.decode())


def only_tenant_one(request):
    return [1]


def test_staff_confined_to_a_tenant_see_only_its_keys(staff, keys, settings):
    settings.TENANCY = {**settings.TENANCY,
                        "ADMIN_TENANTS": "tests.idempotency.test_admin.only_tenant_one"}
    assert listed(staff) == {"done-a", "stuck-a"}
    assert listed(staff, "?tenant_id=2") == set()
    assert page(staff, 2, "payment.capture", "running-b").status_code == 404
    assert page(staff, 1, "payment.capture", "stuck-a").status_code == 200


def test_it_is_read_only(staff, keys):
    assert staff.get(URL + "add/").status_code == 403
    assert staff.post(URL + "done-a/delete/").status_code in (302, 403, 404)
    with observer() as conn:
        assert conn.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0] == 4


def test_the_row_count_stops_at_its_cap(staff, keys, monkeypatch):
    from tenancy.admin import CappedPaginator

    monkeypatch.setattr(CappedPaginator, "cap", 2)
    with CaptureQueriesContext(connections[admin_alias()]) as seen:
        text = staff.get(URL).content.decode()
    assert "3 idempotency keys" in text  # 4 keys: "more than 2"
    [count] = [q["sql"] for q in seen.captured_queries if "COUNT(" in q["sql"].upper()]
    assert "LIMIT 3" in count and "ORDER BY" not in count.upper()


def test_the_list_reads_in_the_primary_keys_order(staff, keys):
    with CaptureQueriesContext(connections[admin_alias()]) as seen:
        assert staff.get(URL).status_code == 200
    [listed] = [q["sql"] for q in seen.captured_queries if " ORDER BY " in q["sql"]]
    assert listed.split(" ORDER BY ")[1].split(" LIMIT ")[0] == (
        '"idempotency_keys"."tenant_id" ASC, "idempotency_keys"."scope" ASC, '
        '"idempotency_keys"."key" ASC'
    )
