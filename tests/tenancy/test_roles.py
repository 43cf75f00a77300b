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


#: The policy expression every tenant-isolated table of the library and the test app has,
#: as PostgreSQL prints it back: what their migrations install, and nothing else.
INSTALLED = "(tenant_id = ( SELECT tenancy_current_tenant() AS tenancy_current_tenant))"


def test_every_tenant_table_has_rls_enabled_forced_and_exactly_the_installed_policy():
    tables = tenant_isolated_tables()
    assert {"idempotency_keys", "outbox_received", "testapp_order"} <= set(tables)
    with app_connection().cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,
                   array_agg(ROW(p.polname, p.polpermissive, p.polcmd, p.polroles::text,
                                 pg_get_expr(p.polqual, p.polrelid),
                                 pg_get_expr(p.polwithcheck, p.polrelid))::text)
              FROM pg_class c JOIN pg_policy p ON p.polrelid = c.oid
             WHERE c.relname = ANY(%s)
             GROUP BY c.relname, c.relrowsecurity, c.relforcerowsecurity
            """,
            [tables],
        )
        rows = {r[0]: r[1:] for r in cursor.fetchall()}
    assert set(rows) == set(tables), "every tenant-isolated table has a policy"
    with app_connection().cursor() as cursor:
        for table, (enabled, forced, policies) in rows.items():
            assert enabled and forced, table
            # One policy, for every command and role, permissive, with exactly the
            # expression in USING and WITH CHECK (tenancy_current_tenant(): app.tenant_id in
            # the plain mode, a verified token in the verified one, docs/roles.md).
            cursor.execute("SELECT ROW(%s, true, '*', '{0}', %s, %s)::text",
                           [f"{table}_tenant_isolation", INSTALLED, INSTALLED])
            assert policies == [cursor.fetchone()[0]], (table, policies)


def test_every_tenant_table_and_role_is_in_the_isolation_test():
    # tests/tenancy/test_isolation.py runs each table with each RLS-bound role granted on it.
    from tests.tenancy.test_isolation import ROWS, granted

    assert set(ROWS) == set(tenant_isolated_tables())
    assert {table for table, _, _ in granted()} == set(ROWS)
    assert {kind for _, kind, _ in granted()} == {"app", "worker"}


def test_the_check_accepts_only_the_installed_expression():
    from tenancy.db import isolating

    assert isolating(INSTALLED, INSTALLED, "public", library=True)
    assert isolating(INSTALLED, None, "public", library=True)  # WITH CHECK falls back to USING
    assert isolating("(tenant_id = ( SELECT public.tenancy_current_tenant() AS"
                     " tenancy_current_tenant))", None, "public", library=True)
    for opened in ("true", f"({INSTALLED} OR true)", "(tenant_id = tenant_id)",
                   "(tenant_id = ( SELECT evil.tenancy_current_tenant() AS"
                   " tenancy_current_tenant))"):
        assert not isolating(opened, INSTALLED, "public"), opened
        assert not isolating(INSTALLED, opened, "public"), opened
    setting = ("(tenant_id = ( SELECT (NULLIF(current_setting('app.tenant_id'::text, true),"
               " ''::text))::bigint AS \"nullif\"))")
    assert isolating(setting, setting, "public")  # a table of yours, the docs' first policy
    assert not isolating(setting, setting, "public", library=True)


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
    assert any(m.id == "idempotency.E091" and "TTLL" in m.msg for m in messages)


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


@pytest.mark.parametrize("widened", [
    "USING ((tenant_id = (SELECT tenancy_current_tenant())) OR true)",
    "WITH CHECK ((tenant_id = (SELECT tenancy_current_tenant())) OR true)",
])
def test_the_check_reports_a_policy_widened_with_or_true_on_outbox_received(widened):
    installed = "(tenant_id = (SELECT tenancy_current_tenant()))"
    with connections["owner"].cursor() as cursor:
        cursor.execute("ALTER POLICY outbox_received_tenant_isolation ON outbox_received "
                       + widened)
    try:
        messages = [m for m in checks.run_checks(databases=[app_alias()])
                    if m.id == "tenancy.E014"]
    finally:
        with connections["owner"].cursor() as cursor:
            cursor.execute("ALTER POLICY outbox_received_tenant_isolation ON outbox_received"
                           f" USING {installed} WITH CHECK {installed}")
    assert [m.msg.split()[1] for m in messages] == ["outbox_received"]
    assert messages[0].hint == "Run the library's migrations; never edit their SQL."
    assert not any(m.id == "tenancy.E014" for m in checks.run_checks(databases=[app_alias()]))


def test_system_checks_on_settings(settings):
    settings.TENANCY = {**settings.TENANCY, "APP_DATABASE": "nope", "SYSTEM_DATABASE": "gone",
                        "TENANT_RESOLVER": "no.such.module.resolver"}
    ids = {m.id for m in checks.run_checks()}
    assert {"tenancy.E003", "tenancy.W004", "tenancy.E006"} <= ids
    settings.IDEMPOTENCY = ["not", "a", "dict"]
    assert "idempotency.E090" in {m.id for m in checks.run_checks()}


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


# --- issue 29, item 7: the web role changes itself for good; check (and health) tell ------

#: What the web role may do to every later session of its own (ALTER ROLE CURRENT_USER SET).
SELF_CHANGES = {
    "timeouts off": ("statement_timeout", "ALTER ROLE CURRENT_USER SET statement_timeout = 0"),
    "read only": ("default_transaction_read_only",
                  "ALTER ROLE CURRENT_USER SET default_transaction_read_only = on"),
    "search_path": ("search_path", "ALTER ROLE CURRENT_USER SET search_path = pg_catalog"),
    "row security off": ("row_security", "ALTER ROLE CURRENT_USER SET row_security = off"),
    "commits before the disk": ("synchronous_commit",
                                "ALTER ROLE CURRENT_USER SET synchronous_commit = off"),
    "in this database only": ("search_path",
                              "DO $$ BEGIN EXECUTE format('ALTER ROLE CURRENT_USER IN DATABASE %I"
                              " SET search_path = pg_catalog', current_database()); END $$"),
}


@pytest.fixture
def restore_roles():
    """Every role setting of the suite's roles reset afterwards, as a superuser."""
    from psycopg import sql

    from tenancy.privileges import role_names
    from tests.helpers import observer

    yield
    with observer() as conn:
        database = conn.execute("SELECT current_database()").fetchone()[0]
        for role in set(role_names().values()):
            conn.execute(sql.SQL("ALTER ROLE {} RESET ALL").format(sql.Identifier(role)))
            conn.execute(sql.SQL("ALTER ROLE {} IN DATABASE {} RESET ALL").format(
                sql.Identifier(role), sql.Identifier(database)))
            conn.execute(sql.SQL("ALTER ROLE {} NOCREATEDB NOREPLICATION CONNECTION LIMIT -1"
                                 " VALID UNTIL 'infinity'").format(sql.Identifier(role)))


def drift_messages(alias: str | None = None) -> list[checks.CheckMessage]:
    """What ``manage.py check --database <alias>`` says of the roles' shapes."""
    return [m for m in checks.run_checks(databases=[alias or app_alias()])
            if m.id in ("tenancy.E041", "tenancy.W042", "tenancy.E043", "tenancy.W044")]


@pytest.mark.parametrize("change", list(SELF_CHANGES))
@pytest.mark.parametrize("way", ["direct", "pooled"])
def test_a_setting_the_web_role_gave_itself_for_good_is_an_error_of_check(change, way, request,
                                                                        restore_roles):
    """``manage.py check`` exited 0 after any of these; it names the role, the parameter, what
    it breaks and the statement that puts it back, and create_roles (the fix) would."""
    from tests.helpers import app_role, connect

    parameter, statement = SELF_CHANGES[change]
    assert drift_messages() == []
    conn = (request.getfixturevalue("pooler").connect("default") if way == "pooled"
            else connect(autocommit=True))
    with conn:
        conn.execute(statement)
    [message] = drift_messages()
    assert message.id == "tenancy.E041", message
    assert f"role {app_role()} (app) has {parameter} = " in message.msg
    assert "RESET" in message.hint and app_role() in message.hint
    assert [m.id for m in drift_messages("system")] == ["tenancy.E041"]  # through any alias


def test_a_tenant_for_every_session_is_an_error_of_check(restore_roles):
    """The web role may not set a placeholder such as app.tenant_id on itself (PostgreSQL 15
    refuses: permission denied); a superuser may, and every session then starts as that
    tenant."""
    import psycopg

    from tests.helpers import app_role, connect, observer

    with connect(autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("ALTER ROLE CURRENT_USER SET app.tenant_id = '2'")
    with observer() as conn:
        conn.execute(f"ALTER ROLE \"{app_role()}\" SET app.tenant_id = '2'")
    [message] = drift_messages()
    assert message.id == "tenancy.E041" and "every session starts as that tenant" in message.msg


def test_declared_role_settings_are_expected_and_held(settings, restore_roles):
    """TENANCY["ROLE_SETTINGS"] says what create_roles sets: missing, it is reported; set, it
    is not; changed by the web role (the timeouts off), it is again."""
    from tenancy.privileges import database_name
    from tests.helpers import app_role, connect, observer

    settings.TENANCY = {**settings.TENANCY,
                        "ROLE_SETTINGS": {"app": {"statement_timeout": "30s"}}}
    [missing] = drift_messages()
    assert missing.id == "tenancy.E041" and (
        f"role {app_role()} (app) lacks statement_timeout = '30s', which create_roles sets"
        in missing.msg)
    with observer() as conn:
        conn.execute(f"ALTER ROLE \"{app_role()}\" IN DATABASE \"{database_name()}\""
                     " SET statement_timeout = '30s'")
    assert drift_messages() == []
    with connect(autocommit=True) as conn:  # for every database: this one's wins
        conn.execute("ALTER ROLE CURRENT_USER SET statement_timeout = 0")
        assert drift_messages() == []
        conn.execute(f'ALTER ROLE CURRENT_USER IN DATABASE "{database_name()}"'
                     " SET statement_timeout = 0")
    [changed] = drift_messages()
    assert "has statement_timeout = '0', where create_roles sets '30s'" in changed.msg
    assert changed.hint.startswith(f"Run, as a superuser: ALTER ROLE \"{app_role()}\" IN "
                                   f"DATABASE \"{database_name()}\" SET statement_timeout = "
                                   "'30s';")


def test_any_other_setting_is_a_warning(restore_roles):
    from tests.helpers import connect

    with connect(autocommit=True) as conn:
        conn.execute("ALTER ROLE CURRENT_USER SET work_mem = '1GB'")
    assert [m.id for m in drift_messages()] == ["tenancy.W042"]


@pytest.mark.parametrize("attribute, expected", [
    ("REPLICATION", "tenancy.E043"),
    ("CREATEROLE", "tenancy.E043"),
    ("CREATEDB", "tenancy.W044"),
    ("CONNECTION LIMIT 3", "tenancy.W044"),
    ("VALID UNTIL '2999-01-01'", "tenancy.W044"),
])
def test_attributes_that_differ_from_what_create_roles_makes_are_reported(attribute, expected,
                                                                          restore_roles):
    from tests.helpers import app_role, observer

    with observer() as conn:
        conn.execute(f'ALTER ROLE "{app_role()}" {attribute}')
    try:
        assert [m.id for m in drift_messages()] == [expected]
    finally:
        with observer() as conn:
            conn.execute(f'ALTER ROLE "{app_role()}" NOCREATEROLE')
