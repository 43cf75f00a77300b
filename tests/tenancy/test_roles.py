"""The suite runs as the real roles: otherwise RLS tests prove nothing."""

import pytest
from django.core import checks
from django.db import connections

from tenancy.aliases import app_alias, system_alias
from tenancy.db import role_facts, table_facts, tenant_isolated_tables
from tests.helpers import app_connection


def test_suite_runs_as_a_role_that_rls_applies_to():
    role = role_facts(app_alias())
    assert not role.superuser
    assert not role.bypassrls
    facts = table_facts(app_alias(), tenant_isolated_tables())
    assert facts, "the library's tables should exist"
    for fact in facts.values():
        assert not fact.owned_by_current_role, fact
        assert fact.rls_active, fact


def test_system_role_is_not_superuser_and_sees_across_tenants():
    role = role_facts(system_alias())
    assert not role.superuser
    facts = table_facts(system_alias(), ["idempotency_keys"])
    assert not facts["idempotency_keys"].rls_active


def test_owner_is_a_different_role():
    with app_connection().cursor() as cursor:
        cursor.execute("SELECT current_user")
        app = cursor.fetchone()[0]
    with connections["owner"].cursor() as cursor:
        cursor.execute("SELECT current_user")
        owner = cursor.fetchone()[0]
    assert app != owner
    assert table_facts("owner", ["idempotency_keys"])["idempotency_keys"].owned_by_current_role


def test_every_tenant_table_has_rls_enabled_forced_and_a_policy_on_the_guc():
    tables = tenant_isolated_tables()
    assert "idempotency_keys" in tables
    with app_connection().cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
                   array_agg(pg_get_expr(p.polqual, p.polrelid)),
                   array_agg(pg_get_expr(p.polwithcheck, p.polrelid))
              FROM pg_class c JOIN pg_policy p ON p.polrelid = c.oid
             WHERE c.relname = ANY(%s)
             GROUP BY c.relname, c.relrowsecurity, c.relforcerowsecurity
            """,
            [tables],
        )
        rows = {r[0]: r[1:] for r in cursor.fetchall()}
    assert set(rows) == set(tables), "every tenant-isolated table has a policy"
    for table, (enabled, forced, quals, checks_) in rows.items():
        assert enabled and forced, table
        # tenancy_current_tenant(): app.tenant_id in the plain mode, a verified
        # token in the verified one (docs/roles.md).
        assert all("tenancy_current_tenant()" in q for q in quals), (table, quals)
        assert all(c and "tenancy_current_tenant()" in c for c in checks_), (table, checks_)


def test_system_checks_pass_for_the_real_roles():
    messages = checks.run_checks(databases=[app_alias(), system_alias()])
    assert [m for m in messages if m.level >= checks.ERROR] == []


def test_system_checks_refuse_an_owner_as_the_app_alias(settings):
    settings.TENANCY = {**settings.TENANCY, "APP_DATABASE": "owner"}
    ids = {m.id for m in checks.run_checks(databases=["owner"])}
    assert "tenancy.E013" in ids


def test_system_checks_refuse_an_rls_bound_system_alias(settings):
    app, system = app_alias(), system_alias()
    settings.TENANCY = {**settings.TENANCY, "SYSTEM_DATABASE": app, "APP_DATABASE": system}
    ids = {m.id for m in checks.run_checks(databases=[app, system])}
    assert "tenancy.E016" in ids  # the app role cannot see across tenants
    assert "tenancy.E012" in ids  # the system role has BYPASSRLS


def test_system_checks_report_unknown_settings(settings):
    settings.IDEMPOTENCY = {"TTLL": 5}
    messages = checks.run_checks()
    assert any(m.id == "tenancy.E002" and "TTLL" in m.msg for m in messages)


def test_system_checks_refuse_a_policy_that_does_not_compare_with_the_tenant():
    with connections["owner"].cursor() as cursor:
        cursor.execute("CREATE POLICY wide_open ON idempotency_keys USING (true)")
    try:
        messages = checks.run_checks(databases=[app_alias()])
        assert any(m.id == "tenancy.E014" and "idempotency_keys" in m.msg for m in messages)
    finally:
        with connections["owner"].cursor() as cursor:
            cursor.execute("DROP POLICY wide_open ON idempotency_keys")
    assert not any(m.id == "tenancy.E014" for m in checks.run_checks(databases=[app_alias()]))


def test_system_checks_on_settings(settings):
    settings.TENANCY = {**settings.TENANCY, "APP_DATABASE": "nope", "SYSTEM_DATABASE": "gone",
                        "TENANT_RESOLVER": "no.such.module.resolver"}
    ids = {m.id for m in checks.run_checks()}
    assert {"tenancy.E003", "tenancy.W004", "tenancy.E006"} <= ids
    settings.IDEMPOTENCY = ["not", "a", "dict"]
    assert "tenancy.E001" in {m.id for m in checks.run_checks()}


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_system_checks_refuse_a_database_that_is_not_postgresql(settings):
    system = system_alias()
    settings.DATABASES = {**settings.DATABASES,
                          system: {**settings.DATABASES[system],
                                   "ENGINE": "django.db.backends.sqlite3"}}
    assert "tenancy.E005" in {m.id for m in checks.run_checks()}


def test_a_table_without_its_policy_is_reported_once_with_a_hint_for_its_owner():
    """One E014 per table, whether the app alias, the system alias or both looked."""
    with connections["owner"].cursor() as cursor:
        cursor.execute("CREATE POLICY wide_open ON idempotency_keys USING (true)")
        cursor.execute("CREATE POLICY wide_open ON testapp_order USING (true)")
    try:
        messages = [m for m in checks.run_checks(databases=[app_alias(), system_alias()])
                    if m.id == "tenancy.E014"]
    finally:
        with connections["owner"].cursor() as cursor:
            cursor.execute("DROP POLICY wide_open ON idempotency_keys")
            cursor.execute("DROP POLICY wide_open ON testapp_order")
    by_table = {m.msg.split()[1]: m.hint for m in messages}
    assert len(messages) == len(by_table) == 2
    assert by_table["idempotency_keys"] == "Run the library's migrations; never edit their SQL."
    assert "makemigrations testapp" in by_table["testapp_order"]
