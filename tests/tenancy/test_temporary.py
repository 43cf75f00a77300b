"""The app and worker roles cannot create temporary objects; check tenancy.E030 says when they can.

PostgreSQL gives PUBLIC ``TEMPORARY`` on every new database. ``migrate`` (and
``grant_privileges``) connected as the database's owner take it away from
the roles whose sessions serve tenants, so nothing of theirs can leave a
temporary table in a pooled server session (docs/roles.md).
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command

from tenancy.aliases import app_alias
from tenancy.checks import check_temporary
from tenancy.privileges import apply_database, database_statements, role_names
from tests.helpers import connect, superuser
from tests.pooler import Pooler, pool_of_one

DOCS = Path(__file__).resolve().parents[2] / "docs"
DATABASE = settings.DATABASES["owner"]["NAME"]


@pytest.fixture
def public_temporary() -> Iterator[None]:
    """PUBLIC has TEMPORARY again, as on a database no one has migrated."""
    with superuser() as conn:
        conn.execute(f'GRANT TEMPORARY ON DATABASE "{DATABASE}" TO PUBLIC')
    yield
    with superuser() as conn:
        conn.execute(f'REVOKE TEMPORARY ON DATABASE "{DATABASE}" FROM PUBLIC')


def can_create_temporary(alias: str, pooler: Pooler | None = None) -> bool:
    conn = connect(alias, autocommit=True) if pooler is None else pooler.connect(alias)
    with conn:
        try:
            conn.execute("CREATE TEMP TABLE probe (a int)")
        except psycopg.errors.InsufficientPrivilege as exc:
            # A session that made its temporary schema while it could (a pooled one) is
            # refused that schema instead.
            assert re.match(r"permission denied (to create temporary tables|for schema pg_temp_)",
                            str(exc)), exc
            return False
        conn.execute("DROP TABLE pg_temp.probe")
        return True


@pytest.mark.parametrize("route", ["direct", "pgbouncer"])
def test_after_migrate_the_app_and_worker_roles_cannot_create_temporary_tables(route):
    if route == "direct":
        assert not can_create_temporary("default")
        assert not can_create_temporary("worker")
        return
    with pool_of_one() as pooler:
        assert not can_create_temporary("default", pooler)
        assert not can_create_temporary("worker", pooler)


def test_the_owner_keeps_it_and_the_system_role_loses_it_with_public():
    with superuser() as conn:
        rows = dict(conn.execute(
            "SELECT rolname, has_database_privilege(oid, current_database(), 'TEMPORARY')"
            " FROM pg_roles WHERE rolname = ANY(%s)",
            [[settings.DATABASES[a]["USER"] for a in ("owner", "system")]],
        ).fetchall())
    assert rows == {settings.DATABASES["owner"]["USER"]: True,
                    settings.DATABASES["system"]["USER"]: False}


def test_the_check_names_the_revoke_while_a_role_can_create_temporary_tables(public_temporary):
    assert can_create_temporary("default") and can_create_temporary("worker")
    errors = check_temporary(databases=[app_alias()])
    names = role_names()
    assert [(e.id, e.msg.split("'")[1]) for e in errors] == [
        ("tenancy.E030", names["app"]), ("tenancy.E030", names["worker"])
    ]
    fix = (f'REVOKE TEMPORARY ON DATABASE "{DATABASE}" FROM PUBLIC; REVOKE TEMPORARY ON DATABASE'
           f' "{DATABASE}" FROM "{names["app"]}", "{names["worker"]}";')
    assert all(fix in e.hint for e in errors), errors[0].hint
    # Not on the owner's alias: migrate, connected as it, runs its checks first and then
    # takes the privilege away itself.
    assert check_temporary(databases=["owner"]) == []
    out = io.StringIO()
    call_command("grant_privileges", database="owner", stdout=out)
    assert not can_create_temporary("default") and not can_create_temporary("worker")
    assert check_temporary(databases=[app_alias()]) == []


def test_migrate_takes_it_away_and_running_it_again_changes_nothing(public_temporary):
    call_command("migrate", database="owner", verbosity=0)
    assert not can_create_temporary("default") and not can_create_temporary("worker")
    assert apply_database("owner") == []  # nothing left to do


def test_a_role_that_does_not_own_the_database_leaves_it_and_says_so(public_temporary):
    assert apply_database(role_alias("system")) is None
    out = io.StringIO()
    with superuser("postgres") as conn:
        conn.execute(f'ALTER DATABASE "{DATABASE}" OWNER TO postgres')
    try:
        call_command("grant_privileges", database="owner", stdout=out)
    finally:
        with superuser("postgres") as conn:
            conn.execute(f'ALTER DATABASE "{DATABASE}" OWNER TO '
                         f'{settings.DATABASES["owner"]["USER"]}')
    assert "keep TEMPORARY; its owner should run: REVOKE TEMPORARY ON DATABASE" in out.getvalue()
    assert can_create_temporary("default")


def role_alias(kind: str) -> str:
    from tenancy.aliases import app_alias, worker_alias
    from tenancy.conf import tenancy_settings

    return {"app": app_alias(), "worker": worker_alias(),
            "system": tenancy_settings.SYSTEM_DATABASE}[kind]


def test_grant_privileges_prints_the_revoke_for_the_databases_owner():
    out = io.StringIO()
    call_command("grant_privileges", print_only=True, stdout=out)
    assert out.getvalue().splitlines()[-2:] == database_statements(DATABASE)


def test_the_revoke_in_the_docs_is_what_grant_privileges_prints():
    page = (DOCS / "roles.md").read_text()
    block = re.search(r"<!-- temporary:start -->\n```sql\n(.*?)```\n<!-- temporary:end -->",
                      page, re.S)
    assert block, "docs/roles.md has no generated TEMPORARY block"
    roles = {"app": "shop_app", "worker": "shop_worker", "system": "shop_system"}
    assert block.group(1).splitlines() == database_statements("shop", roles)
