"""Policies written by ``makemigrations`` for tenant-isolated models (tenancy/policies.py).

A model of yours with ``tenant_isolated = True`` carries a ``TenantIsolation``
constraint; ``makemigrations`` writes it (new model, or an existing one that
becomes tenant-isolated), with a dependency on tenancy's migration that
defines the SQL functions it calls; migrating enables and forces RLS with the
design's one policy, reversibly; and the test app's hand-written policy
migrations (0002, 0004, 0006) keep working: its 0007, written by
makemigrations, takes their policies over and gives them back when reversed.
"""

from __future__ import annotations

from types import SimpleNamespace

import psycopg
import pytest
from django.apps import apps
from django.core.management import call_command
from django.core.management.commands import makemigrations
from django.db import connections, migrations
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.state import ProjectState

from tenancy.policies import FUNCTION_MIGRATION, TenantIsolation, policy_name
from tenancy.privileges import role_names
from tests.helpers import as_tenant, connect, observer, raises_rls_violation

TABLE = "policy_probe"
POLICY = f"{TABLE}_tenant_isolation"
HAND_WRITTEN = (
    f"CREATE POLICY {POLICY} ON {TABLE}"
    " USING (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint))"
    " WITH CHECK (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint))"
)


def test_tenant_isolated_models_of_yours_carry_the_policy_and_the_librarys_do_not():
    def policies(label: str) -> list[str]:
        return [c.name for c in apps.get_model(label)._meta.constraints
                if isinstance(c, TenantIsolation)]

    assert policies("testapp.Order") == ["testapp_order_tenant_isolation"]
    assert policies("testapp.Payment") == ["testapp_payment_tenant_isolation"]
    assert policies("testapp.PlainOrder") == []
    for label in ("idempotency.IdempotencyKey", "outbox.OutboxMessage"):
        assert policies(label) == []  # their policies ship in their SQL files


def _changes(from_state: ProjectState, to_state: ProjectState) -> list[migrations.Migration]:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    detector = makemigrations.Command.autodetector(from_state, to_state)
    return detector.changes(graph=loader.graph, trim_to_apps={"testapp"}).get("testapp", [])


def _state() -> ProjectState:
    return MigrationLoader(None, ignore_no_migrations=True).project_state()


def test_the_test_apps_migrations_are_up_to_date():
    call_command("makemigrations", "testapp", check=True, dry_run=True, verbosity=0)


def test_a_model_declared_tenant_isolated_later_gets_the_migration_too():
    before = _state()
    order = before.models["testapp", "order"]
    order.options["constraints"] = [
        c for c in order.options["constraints"] if not isinstance(c, TenantIsolation)
    ]
    [migration] = _changes(before, _state())
    [operation] = migration.operations
    assert isinstance(operation, migrations.AddConstraint)
    assert operation.constraint == TenantIsolation(name="testapp_order_tenant_isolation")
    assert FUNCTION_MIGRATION in migration.dependencies


def test_a_new_tenant_isolated_model_is_created_with_its_policy():
    before = _state()
    before.remove_model("testapp", "payment")
    [migration] = _changes(before, _state())
    [create] = [op for op in migration.operations if isinstance(op, migrations.CreateModel)]
    assert TenantIsolation(name="testapp_payment_tenant_isolation") in create.options[
        "constraints"]
    assert FUNCTION_MIGRATION in migration.dependencies


def test_a_model_no_longer_tenant_isolated_loses_its_policy():
    after = _state()
    payment = after.models["testapp", "payment"]
    payment.options["constraints"] = []
    [migration] = _changes(_state(), after)
    [operation] = migration.operations
    assert isinstance(operation, migrations.RemoveConstraint)
    assert operation.name == "testapp_payment_tenant_isolation"


def test_a_long_table_name_gets_a_policy_name_postgresql_keeps():
    name = policy_name("t" * 63)
    assert len(name) <= 63 and name.endswith("_tenant_isolation")
    assert name != policy_name("t" * 62 + "u")


@pytest.fixture
def probe():
    names = role_names()
    with observer() as conn:
        conn.execute(f'SET ROLE "{connections["owner"].settings_dict["USER"]}"')
        conn.execute(f"CREATE TABLE {TABLE} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                     " tenant_id bigint NOT NULL, note text NOT NULL DEFAULT '')")
        conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON {TABLE} TO "{names["app"]}"')
    try:
        yield
    finally:
        with observer() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}")


def _run(method: str) -> None:
    """The constraint's SQL, as the owner runs it in a migration."""
    model = SimpleNamespace(_meta=SimpleNamespace(db_table=TABLE))
    with connections["owner"].schema_editor() as editor:
        editor.execute(getattr(TenantIsolation(name=POLICY), method)(model, editor), params=None)
    connections["owner"].close()


def _facts() -> tuple[bool, bool, list[tuple[str, str]]]:
    with observer() as conn:
        enabled, forced = conn.execute(
            "SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE relname = %s",
            [TABLE]).fetchone()
        policies = conn.execute(
            "SELECT policyname, format('%%s %%s %%s %%s %%s', permissive, roles, cmd, qual,"
            " with_check) FROM pg_policies WHERE tablename = %s ORDER BY 1", [TABLE]).fetchall()
    return enabled, forced, policies


def test_the_policy_isolates_the_table_for_the_app_role_and_reverses(probe):
    _run("create_sql")
    enabled, forced, policies = _facts()
    assert (enabled, forced) == (True, True)
    assert [name for name, _ in policies] == [POLICY]
    assert policies[0][1].count("tenancy_current_tenant()") == 2  # USING and WITH CHECK
    with connect() as conn:
        with as_tenant(conn, 1) as cur:
            cur.execute(f"INSERT INTO {TABLE} (tenant_id) VALUES (1)")
        with as_tenant(conn, 2) as cur:
            assert cur.execute(f"SELECT count(*) FROM {TABLE}").fetchone() == (0,)
            with raises_rls_violation():
                cur.execute(f"INSERT INTO {TABLE} (tenant_id) VALUES (1)")
        with as_tenant(conn, None) as cur:
            assert cur.execute(f"SELECT count(*) FROM {TABLE}").fetchone() == (0,)
    _run("remove_sql")
    assert _facts() == (False, False, [])
    with connect() as conn:
        assert conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone() == (1,)


@pytest.mark.parametrize("hand_written, force", [
    (HAND_WRITTEN, True),
    (f"CREATE POLICY {POLICY} ON {TABLE} AS RESTRICTIVE FOR SELECT TO PUBLIC"
     " USING (tenant_id > 0)", False),
])
def test_a_hand_written_policy_of_the_same_name_is_taken_over_and_given_back(
    probe, hand_written, force
):
    with observer() as conn:
        conn.execute(f'SET ROLE "{connections["owner"].settings_dict["USER"]}"')
        conn.execute(f"ALTER TABLE {TABLE} ENABLE ROW LEVEL SECURITY")
        if force:
            conn.execute(f"ALTER TABLE {TABLE} FORCE ROW LEVEL SECURITY")
        conn.execute(hand_written)
    before = _facts()
    _run("create_sql")  # no error, no second policy
    enabled, forced, policies = _facts()
    assert (enabled, forced) == (True, True)
    assert [name for name, _ in policies] == [POLICY]
    assert policies[0][1].count("tenancy_current_tenant()") == 2
    _run("remove_sql")
    assert _facts() == before


def test_the_test_apps_hand_written_policies_come_back_when_its_migration_is_reversed():
    def order_policy() -> tuple[str, str]:
        with observer() as conn:
            return conn.execute(
                "SELECT qual, coalesce(obj_description(p.oid, 'pg_policy'), '')"
                " FROM pg_policies q JOIN pg_policy p ON p.polname = q.policyname"
                " WHERE q.tablename = 'testapp_order'").fetchone()

    qual, note = order_policy()
    assert "tenancy_current_tenant()" in qual and note.startswith("tenancy_isolate: ")
    try:
        call_command("migrate", "testapp", "0006", database="owner", verbosity=0)
        # 0006's own policy (the function form too), without 0007's note.
        assert order_policy() == (qual, "")
    finally:
        call_command("migrate", "testapp", database="owner", verbosity=0)
    assert order_policy() == (qual, note)


def test_nothing_but_the_owner_may_call_the_functions():
    with connect() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT tenancy_isolate('testapp_order'::regclass, 'x')")


def test_a_tenant_isolated_model_without_a_tenant_id_of_its_own_is_an_error(monkeypatch):
    from django.db import models
    from django.test.utils import isolate_apps

    from tenancy import checks

    with isolate_apps("tests.testapp"):
        class Parent(models.Model):
            tenant_isolated = True
            tenant_id = models.BigIntegerField()

            class Meta:
                app_label = "testapp"

        class Child(Parent):  # a multi-table child: its table has no tenant_id
            class Meta:
                app_label = "testapp"

        monkeypatch.setattr(checks, "tenant_isolated_models", lambda: [Parent, Child])
        found = checks.check_policy_declarations()
    assert [(m.id, m.obj) for m in found] == [("tenancy.E029", Child)]
    assert "no tenant_id column of its own" in found[0].msg
