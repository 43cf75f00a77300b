"""Every method of a tenant-scoped view runs as the request's tenant (docs/mixin.md, docs/roles.md).

Under row-level security a query with no tenant set sees no row: these
tests fail, with empty lists and 404s, where a view runs without one.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client as DjangoClient
from rest_framework.test import APIClient

from tenancy import tenant_context
from tenancy.aliases import app_alias
from tenancy.context import search_path_sql
from tests.helpers import count_rows, statements
from tests.testapp.factories import OrderFactory


@pytest.fixture
def api():
    return APIClient()


@pytest.fixture
def orders():
    """Two orders of tenant 1 (alice's) and one of tenant 2 (bob's), committed."""
    with tenant_context(1):
        tea, cake = OrderFactory(sku="tea"), OrderFactory(sku="cake")
    with tenant_context(2):
        rice = OrderFactory(sku="rice")
    return {"tea": tea.pk, "cake": cake.pk, "rice": rice.pk}


def get(api, path, user="alice", **headers):
    if user:
        headers["X-User"] = user
    return api.get(path, headers=headers)


def problem(response) -> dict:
    assert response["Content-Type"] == "application/problem+json"
    return json.loads(response.content)


# --- TenantScopedViewMixin ------------------------------------------------------


def test_a_list_shows_the_tenants_rows_and_only_those(api, orders):
    assert [o["sku"] for o in get(api, "/scoped-orders/").json()] == ["tea", "cake"]
    assert [o["sku"] for o in get(api, "/scoped-orders/", user="bob").json()] == ["rice"]


def test_a_retrieve_finds_the_tenants_row_and_404s_another_tenants(api, orders):
    own = get(api, f"/scoped-orders/{orders['tea']}/")
    assert own.status_code == 200 and own.json()["sku"] == "tea"
    assert get(api, f"/scoped-orders/{orders['rice']}/").status_code == 404
    assert get(api, f"/scoped-orders/{orders['rice']}/", user="bob").status_code == 200


def test_an_unsafe_method_runs_as_the_tenant_too(api):
    response = api.post("/scoped-orders/", {"sku": "tea"}, format="json",
                        headers={"X-User": "bob"})
    assert response.status_code == 201, response.content
    assert count_rows("testapp_order", "tenant_id = 2") == 1


def test_a_handler_that_raises_rolls_its_writes_back(api):
    response = api.post("/scoped-orders/", {"sku": "tea", "then": "decline"}, format="json",
                        headers={"X-User": "alice"})
    assert response.status_code == 402
    assert count_rows("testapp_order") == 0


def test_a_request_without_a_tenant_gets_a_problem_and_runs_nothing(api, orders):
    response = get(api, "/scoped-orders/", user="nobody")
    assert response.status_code == 403
    assert problem(response) == {
        "type": "about:blank", "title": "Forbidden", "status": 403,
        "detail": "The request does not belong to a tenant.", "code": "tenant_unknown",
    }
    created = api.post("/scoped-orders/", {"sku": "tea"}, format="json",
                       headers={"X-User": "nobody"})
    assert created.status_code == 403
    assert count_rows("testapp_order") == 3  # the fixture's, nothing more


def test_the_no_tenant_status_is_a_tenancy_setting(api, settings):
    settings.TENANCY = {**settings.TENANCY, "STATUS_NO_TENANT": 404}
    response = get(api, "/scoped-orders/", user="nobody")
    assert response.status_code == 404
    assert problem(response)["code"] == "tenant_unknown"


def test_authentication_still_comes_first(api):
    assert get(api, "/scoped-orders/", user=None).status_code in (401, 403)
    assert "application/problem+json" not in get(api, "/scoped-orders/", user=None)["Content-Type"]


def test_the_answer_is_rendered_as_the_tenant(api, orders):
    # DRF's JSON encoder evaluates a queryset only while rendering the answer.
    assert get(api, "/lazy-skus/").json() == {"skus": ["tea", "cake"]}


def test_an_opted_out_view_runs_without_a_tenant(api, orders, settings):
    def resolver(request):
        raise AssertionError("an opted-out view does not ask the resolver")

    settings.TENANCY = {**settings.TENANCY, "TENANT_RESOLVER": resolver}
    for user in ("nobody", "alice"):
        response = get(api, "/unscoped-status/", user=user)
        assert response.status_code == 200, response.content
        assert response.json() == {"tenant": None, "visible_orders": 0}


def test_get_tenant_is_the_hook_that_names_the_tenant(api, orders):
    listed = get(api, "/header-tenant-orders/", **{"X-Tenant": "2"})
    assert [o["sku"] for o in listed.json()] == ["rice"]


def test_a_streamed_answer_runs_after_the_tenants_transaction(api, orders):
    response = get(api, "/streamed-skus/")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b""  # as docs/mixin.md warns


def test_a_method_the_view_lacks_is_still_405(api):
    assert api.delete("/scoped-orders/", headers={"X-User": "nobody"}).status_code == 405


# --- IdempotentViewMixin builds on it ----------------------------------------------


def test_safe_methods_of_an_idempotent_view_run_as_the_tenant(api, orders):
    assert [o["sku"] for o in get(api, "/order-book/").json()] == ["tea", "cake"]
    assert get(api, f"/order-book/{orders['rice']}/").status_code == 404
    assert get(api, f"/order-book/{orders['tea']}/").status_code == 200
    assert problem(get(api, "/order-book/", user="nobody"))["code"] == "tenant_unknown"
    assert count_rows("idempotency_keys") == 0  # reads need no key and store none


@pytest.mark.plain_context(reason="asserts the plain mode's SET LOCAL text")
def test_a_post_through_the_idempotent_mixin_sets_the_tenant_once(api):
    with statements() as sent:
        response = api.post("/order-book/", {"sku": "tea"}, format="json",
                            headers={"X-User": "alice", "Idempotency-Key": "k1"})
    assert response.status_code == 201, response.content
    pin = search_path_sql(app_alias())
    # The read of the key before its transaction is one message, one implicit
    # transaction with its own SET LOCAL and its names pinned (idempotency.store.peek);
    # the key's transaction sets the tenant once, with its names pinned too.
    assert [s for s in sent if s.startswith("SET LOCAL")] == [
        "SET LOCAL app.tenant_id = '1'", pin, f"SET LOCAL app.tenant_id = '1'; {pin}",
    ]
    # One savepoint, the handler's: no tenant_context of the view around the key's transaction.
    assert len([s for s in sent if s.startswith("SAVEPOINT")]) == 1
    assert count_rows("testapp_order", "tenant_id = 1") == 1


def test_an_idempotent_view_that_opted_out_still_needs_a_tenant_for_writes(api, orders):
    assert get(api, "/opted-out-order-book/", user="nobody").json() == []  # no tenant: no rows
    refused = api.post("/opted-out-order-book/", {"sku": "tea"}, format="json",
                       headers={"X-User": "nobody", "Idempotency-Key": "k1"})
    assert problem(refused)["code"] == "tenant_unknown"
    created = api.post("/opted-out-order-book/", {"sku": "tea"}, format="json",
                       headers={"X-User": "alice", "Idempotency-Key": "k1"})
    assert created.status_code == 201
    assert count_rows("testapp_order", "tenant_id = 1") == 3


def test_without_a_tenant_an_idempotent_post_is_refused_before_its_key(api):
    response = api.post("/order-book/", {"sku": "tea"}, format="json",
                        headers={"X-User": "nobody"})  # no key either
    assert problem(response)["code"] == "tenant_unknown"
    assert count_rows("testapp_order") == 0


# --- plain Django views -------------------------------------------------------------


@pytest.fixture
def header_resolver(settings):
    users = {"alice": 1, "bob": 2}
    settings.TENANCY = {
        **settings.TENANCY,
        "TENANT_RESOLVER": lambda request: users.get(request.headers.get("X-User", "")),
    }


def test_tenant_scoped_runs_a_plain_view_as_the_tenant(header_resolver, orders):
    client = DjangoClient()
    assert client.get("/django-scoped-orders/", headers={"X-User": "alice"}).json() == {
        "skus": ["tea", "cake"]
    }
    refused = client.get("/django-scoped-orders/")
    assert refused.status_code == 403 and problem(refused)["code"] == "tenant_unknown"


def test_safe_methods_of_an_idempotent_plain_view_run_as_the_tenant(header_resolver, orders):
    client = DjangoClient()
    assert client.get("/django-orders/", headers={"X-User": "bob"}).json() == {"skus": ["rice"]}
    assert client.get("/django-orders/").status_code == 403
