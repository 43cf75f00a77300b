"""Privileges, as the real roles: the web role cannot touch shared delivery state, the worker
role sees only its tenant's failures, migrate grants exactly the matrix, and check tells."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command

from outbox.consumers import ensure_offsets, run_batch
from outbox.observation import status
from tenancy.aliases import app_alias
from tenancy.checks import check_privileges
from tenancy.privileges import apply, compare, role_names, statements
from tests.helpers import as_tenant, connect, observer
from tests.outbox.support.helpers import publish_many
from tests.outbox.support.recorders import FAILING, OrderRecorder

A, B = 1, 2
DOCS = Path(__file__).resolve().parents[2] / "docs"


def _acls() -> dict[str, str]:
    with observer() as conn:
        return dict(conn.execute(
            "SELECT relname, coalesce(relacl::text, '') FROM pg_class"
            " WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p')"
        ).fetchall())


@pytest.mark.parametrize("statement", [
    "SELECT * FROM consumer_offsets",
    "UPDATE consumer_offsets SET last_id = last_id + 1",
    "INSERT INTO consumer_offsets (name, partition, partition_count) VALUES ('x', 0, 1)",
    "DELETE FROM consumer_offsets",
    "SELECT * FROM consumer_offsets FOR UPDATE",
    "SELECT * FROM outbox_consumer_failures",
    "SELECT * FROM idempotency_leases",
    "UPDATE outbox_messages SET topic = 'x'",
    "DELETE FROM outbox_messages",
    "TRUNCATE outbox_received",
    "SELECT secret FROM outbox_fence_key",
    "SELECT outbox_fence_proof_v1(1, 2)",
])
def test_the_web_role_cannot_touch_shared_delivery_state(statement):
    with connect() as conn, as_tenant(conn, A):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)


def test_a_tenant_on_the_worker_role_cannot_see_or_move_another_tenants_failure():
    FAILING.add("bad")
    try:
        publish_many(B, "order.placed", [{"sku": "bad"}])
        consumer = OrderRecorder()
        ensure_offsets(consumer)
        assert run_batch(consumer).failed
    finally:
        FAILING.discard("bad")
    with connect("worker") as conn:
        with as_tenant(conn, B) as cur:
            assert cur.execute(
                "SELECT count(*) FROM outbox_consumer_failures").fetchone()[0] == 1
        with as_tenant(conn, A) as cur:  # tenant 1, inside its context, sees nothing
            assert cur.execute("SELECT count(*) FROM outbox_consumer_failures").fetchone() == (0,)
            assert cur.execute("UPDATE outbox_consumer_failures SET error = 'x'").rowcount == 0
            assert cur.execute("DELETE FROM outbox_consumer_failures").rowcount == 0
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                cur.execute("SELECT * FROM outbox_dead_letters FOR UPDATE")  # no UPDATE there
    # ...and the system role shows it, with its tenant, for operators.
    (reader,) = [r for r in status().readers if r.name == "orders"]
    assert reader.attempts == 1 and reader.failing_tenant == B
    assert "transient failure on bad" in reader.last_error
    with observer() as conn:
        columns = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'consumer_offsets'").fetchall()]
    assert "last_error" not in columns  # no tenant data on the shared row


def test_a_failure_row_goes_when_the_partition_passes_its_message():
    FAILING.add("flaky")
    try:
        publish_many(B, "order.placed", [{"sku": "flaky"}])
        consumer = OrderRecorder()
        ensure_offsets(consumer)
        assert run_batch(consumer).failed
    finally:
        FAILING.discard("flaky")
    with observer() as conn:
        conn.execute("UPDATE consumer_offsets SET retry_at = now() WHERE name = 'orders'")
    assert run_batch(consumer).handled == 1
    with observer() as conn:
        assert conn.execute("SELECT count(*) FROM outbox_consumer_failures").fetchone() == (0,)


def test_migrate_grants_exactly_the_matrix_and_running_it_again_changes_nothing():
    assert compare("owner") == []
    before = _acls()
    call_command("migrate", database="owner", verbosity=0)
    call_command("grant_privileges", database="owner", verbosity=0)
    assert _acls() == before
    names = role_names()
    with observer() as conn:
        app_on_offsets = conn.execute(
            "SELECT has_table_privilege(%s, 'consumer_offsets', 'SELECT')", [names["app"]]
        ).fetchone()[0]
    assert app_on_offsets is False


def test_the_check_names_the_grant_for_a_missing_privilege_and_the_revoke_for_an_extra():
    names = role_names()
    with observer() as conn:
        conn.execute(f'REVOKE INSERT ON consumer_offsets FROM "{names["worker"]}"')
        conn.execute(f'GRANT UPDATE ON consumer_offsets TO "{names["app"]}"')
        conn.execute(f'GRANT TRUNCATE ON outbox_messages TO "{names["system"]}"')
    try:
        # Through the app alias: each difference is an error naming its fix (through
        # the owner's, one warning that migrate applies them: test_setup_upgrade.py).
        found = {(e.id, e.hint.split(": ", 1)[1].split(" (")[0])
                 for e in check_privileges(databases=[app_alias()])}
        assert found == {
            ("tenancy.E017", f'GRANT INSERT ON "consumer_offsets" TO "{names["worker"]}";'),
            ("tenancy.E018", f'REVOKE UPDATE ON "consumer_offsets" FROM "{names["app"]}";'),
            ("tenancy.E018", f'REVOKE TRUNCATE ON "outbox_messages" FROM "{names["system"]}";'),
        }
    finally:
        apply("owner")
    assert check_privileges(databases=[app_alias()]) == []
    assert check_privileges(databases=["owner"]) == []


def test_the_web_role_reads_the_migrations_record_and_cannot_change_it():
    # runserver checks for unapplied migrations on the web process's alias at start-up.
    from django.db import connections
    from django.db.migrations.executor import MigrationExecutor

    from tenancy.aliases import app_alias

    executor = MigrationExecutor(connections[app_alias()])
    assert executor.migration_plan(executor.loader.graph.leaf_nodes()) == []
    with connect() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM django_migrations")


def test_the_grant_command_refuses_an_alias_that_does_not_own_the_tables():
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="does not connect as the owner"):
        call_command("grant_privileges", database=settings.TENANCY.get("APP_DATABASE", "default"))


def test_the_grant_list_in_the_docs_is_the_matrix():
    page = (DOCS / "roles.md").read_text()
    block = re.search(r"<!-- grants:start -->\n```sql\n(.*?)```\n<!-- grants:end -->", page, re.S)
    assert block, "docs/roles.md has no generated grant block"
    source = statements(
        ["tenancy", "idempotency", "outbox"],
        {"app": "shop_app", "worker": "shop_worker", "system": "shop_system"},
    )
    assert block.group(1).splitlines() == source


# --- docs/roles.md, "Your own tables": GRANT_PROJECT_TABLES only adds --------------------


def test_project_table_grants_only_add_and_keep_grants_made_by_hand(settings):
    assert settings.TENANCY["GRANT_PROJECT_TABLES"]  # the test settings turn it on
    names = role_names()
    app, worker, system = names["app"], names["worker"], names["system"]
    with observer() as conn:
        # By hand: a handler writes a table that is not tenant-isolated; a report reads it.
        conn.execute(f"GRANT SELECT, INSERT ON testapp_plain_order TO {worker}")
        conn.execute(f"GRANT SELECT ON testapp_plain_order TO {system}")
        conn.execute(f"REVOKE UPDATE ON testapp_order FROM {app}")  # one of ours, missing
    try:
        ran = apply("owner")
        assert ran == [f'GRANT UPDATE ON "testapp_order" TO "{app}";']  # added; nothing revoked
        with observer() as conn:
            held = dict(conn.execute(
                "SELECT r, string_agg(p, ',' ORDER BY p) FROM unnest(%s::text[]) r,"
                " unnest(array['SELECT', 'INSERT', 'UPDATE', 'DELETE']) p"
                " WHERE has_table_privilege(r, 'testapp_plain_order', p) GROUP BY r",
                [[app, worker, system]]).fetchall())
            assert conn.execute("SELECT has_table_privilege(%s, 'testapp_order', 'UPDATE')",
                                [app]).fetchone()[0]
        assert held == {app: "DELETE,INSERT,SELECT,UPDATE", worker: "INSERT,SELECT",
                        system: "SELECT"}
        assert apply("owner") == []  # and again: nothing to do
    finally:
        with observer() as conn:
            conn.execute(f"REVOKE ALL ON testapp_plain_order FROM {worker}, {system}")
            conn.execute(f"GRANT UPDATE ON testapp_order TO {app}")


# --- issue 29, item 2: GRANT_PROJECT_TABLES opens no table without RLS unless it is shared --


def test_a_table_of_yours_without_rls_is_opened_only_when_shared(settings):
    """testapp_plain_order holds every tenant's rows with no row-level security: migrate
    opens it to the app role only because the test settings list it in SHARED_TABLES.
    Without that, migrate's grants leave it closed, and check says which tables, and why."""
    from django.core import checks

    from tenancy.privileges import closed_tables, project_tables

    app = role_names()["app"]
    assert "testapp_plain_order" in project_tables()
    settings.TENANCY = {**settings.TENANCY, "SHARED_TABLES": [
        s for s in settings.TENANCY["SHARED_TABLES"] if s != "testapp_plain_order"]}
    assert "testapp_plain_order" not in project_tables()
    assert closed_tables() == ["testapp_plain_order"]
    [warning] = [m for m in checks.run_checks() if m.id == "tenancy.W040"]
    assert "testapp_plain_order" in warning.msg and "SHARED_TABLES" in warning.hint
    with observer() as conn:
        conn.execute(f'REVOKE ALL ON testapp_plain_order FROM "{app}"')
    try:
        assert not [s for s in apply("owner") if "testapp_plain_order" in s]
        with observer() as conn:
            assert not conn.execute("SELECT has_table_privilege(%s, 'testapp_plain_order',"
                                    " 'SELECT')", [app]).fetchone()[0]
        with connect() as conn, as_tenant(conn, A):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT * FROM testapp_plain_order")
    finally:
        with observer() as conn:
            conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON testapp_plain_order TO "{app}"')
    settings.TENANCY = {**settings.TENANCY, "SHARED_TABLES": [
        *settings.TENANCY["SHARED_TABLES"], "testapp_plain_order"]}
    assert not [m for m in checks.run_checks() if m.id == "tenancy.W040"]
