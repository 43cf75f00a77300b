"""One alias rule: the ORM goes where tenant_context sets the tenant (docs/settings.md).

``make test-app-alias`` runs the whole tenancy, idempotency and outbox suites
with the app alias named ``app`` and this router; these tests pin the router
and the checks that tell a project it needs one.
"""

from __future__ import annotations

import pytest
from django.core import checks
from django.db import router

from tenancy import AppDatabaseRouter, tenant_context
from tenancy.aliases import app_alias
from tests.testapp.models import Order

ROUTER = ["tenancy.routers.AppDatabaseRouter"]

pytestmark = pytest.mark.filterwarnings("ignore:Overriding setting DATABASE")


def ids(**kwargs) -> list[str]:
    return [m.id for m in checks.run_checks(**kwargs) if m.id]


def test_the_router_sends_reads_and_writes_to_the_app_alias(settings):
    settings.TENANCY = {**settings.TENANCY, "APP_DATABASE": "owner"}
    routes = AppDatabaseRouter()
    assert routes.db_for_read(Order) == routes.db_for_write(Order) == "owner"
    settings.DATABASE_ROUTERS = ROUTER
    assert Order.objects.all().db == "owner"
    assert router.db_for_write(Order, instance=Order(tenant_id=1)) == "owner"  # unsaved


def test_an_instance_is_saved_where_it_was_read(settings):
    settings.DATABASE_ROUTERS = ROUTER
    with tenant_context(1):
        Order.objects.create(tenant_id=1, sku="tea")
    with tenant_context(1):
        order = Order.objects.get()
    assert order._state.db == app_alias()
    order._state.db = "system"  # as if read with .using("system")
    assert AppDatabaseRouter().db_for_write(Order, instance=order) is None
    assert router.db_for_write(Order, instance=order) == "system"


def test_the_router_does_not_decide_migrations():
    assert not hasattr(AppDatabaseRouter(), "allow_migrate")


def test_a_tenant_isolated_model_routed_away_from_the_app_alias_is_an_error(settings):
    settings.DATABASE_ROUTERS = []
    settings.TENANCY = {**settings.TENANCY, "APP_DATABASE": "owner"}
    assert "tenancy.E008" in ids()
    errors = [m for m in checks.run_checks() if m.id == "tenancy.E008"]
    assert Order in {m.obj for m in errors}
    assert all(m.obj._meta.app_label == "testapp" for m in errors)  # not the library's own
    settings.DATABASE_ROUTERS = ROUTER
    assert "tenancy.E008" not in ids()


def test_the_checks_pass_where_the_app_alias_is_default_without_a_router(settings):
    if app_alias() != "default":
        pytest.skip("these settings name the app alias otherwise, with a router")
    assert not {"tenancy.E008", "tenancy.W009"} & set(ids())


def test_no_router_at_all_for_another_app_alias_is_a_warning(settings):
    settings.INSTALLED_APPS = [a for a in settings.INSTALLED_APPS if a != "tests.testapp"]
    settings.DATABASE_ROUTERS = []
    settings.TENANCY = {**settings.TENANCY, "APP_DATABASE": "owner"}
    assert "tenancy.W009" in ids()
    settings.DATABASE_ROUTERS = ROUTER
    assert "tenancy.W009" not in ids()
