"""Upgrading is one step: ``migrate`` as the owner brings an earlier database to the matrix.

Two starting points, each kept as the SQL that made it (tests/tenancy/upgrade/):
the privileges the previous release's ``migrate`` left (0.1.0.dev0, with
``GRANT_PROJECT_TABLES``), and the grant lists the docs gave before there was
a matrix (DML on every table for the app role, the sequences, the outbox's
list). From each, the documented upgrade step (CHANGELOG.md, docs/installation.md),
``python manage.py migrate --database owner``, must run (it used to stop on its
own privilege check) and leave exactly the matrix, with the commands a
developer runs working through every alias.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from tenancy.aliases import app_alias, system_alias, worker_alias
from tenancy.checks import check_privileges
from tenancy.privileges import apply, compare, role_names
from tests.helpers import observer

STATES = Path(__file__).parent / "upgrade"
TEST_ROLES = {"app": "dio_app", "worker": "dio_worker", "system": "dio_system"}


def put_database_in(state: str) -> None:
    """Privileges as ``state`` left them: nothing else granted to the three roles or PUBLIC."""
    names = role_names()
    sql = (STATES / f"{state}.sql").read_text()
    for kind, page_role in TEST_ROLES.items():
        sql = re.sub(rf"\b{page_role}\b", f'"{names[kind]}"', sql)
    roles = ", ".join(f'"{names[kind]}"' for kind in TEST_ROLES)
    with observer() as conn:
        conn.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {roles}, PUBLIC")
        conn.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {roles}")
        # As the owner, who granted them then (the matrix's REVOKEs are the owner's too).
        conn.execute(f'SET ROLE "{settings.DATABASES["owner"]["USER"]}"')
        for statement in re.split(r";\s*$", re.sub(r"--[^\n]*", "", sql), flags=re.M):
            if statement.strip():
                conn.execute(statement)


@pytest.fixture
def converges_after():
    yield
    apply("owner")  # whatever a test left, the next one starts from the matrix


@pytest.mark.parametrize("state", ["0.1.0.dev0", "before-the-matrix"])
def test_migrate_as_the_owner_brings_an_earlier_database_to_the_matrix(state, converges_after):
    put_database_in(state)
    differences = compare("owner")
    assert differences, f"{state}: the state should differ from today's matrix"
    assert [e.id for e in check_privileges(databases=["owner"])] == ["tenancy.W027"]

    call_command("migrate", database="owner", verbosity=0)  # the upgrade step; it used to stop

    assert compare("owner") == []
    for alias in (app_alias(), worker_alias(), system_alias(), "owner"):
        assert check_privileges(databases=[alias]) == [], alias
    assert apply("owner") == []  # converged: a second migrate has nothing to do
    with observer() as conn:
        names = role_names()
        held = dict(conn.execute(
            "SELECT r, has_table_privilege(r, 'django_migrations', 'SELECT')"
            " FROM unnest(%s::text[]) r",
            [list(names.values())],
        ).fetchall())
        app_on_offsets = conn.execute(
            "SELECT has_table_privilege(%s, 'consumer_offsets', 'SELECT, UPDATE')",
            [names["app"]],
        ).fetchone()[0]
    assert all(held.values()), held
    assert app_on_offsets is False


def test_after_the_upgrade_every_alias_runs_the_commands_a_developer_runs(converges_after):
    """makemigrations reads django_migrations through every alias (its consistency check)."""
    put_database_in("0.1.0.dev0")
    call_command("migrate", database="owner", verbosity=0)
    call_command("makemigrations", check=True, dry_run=True, verbosity=0)
    for alias in (app_alias(), worker_alias(), system_alias(), "owner"):
        call_command("showmigrations", database=alias, verbosity=0)
        call_command("check", databases=[alias], verbosity=0)


def test_a_grant_to_public_on_a_table_the_matrix_governs_is_taken_back(converges_after):
    with observer() as conn:
        conn.execute("GRANT SELECT, UPDATE ON consumer_offsets, django_migrations TO PUBLIC")
    assert {f.table for f in compare("owner")} == {"consumer_offsets", "django_migrations"}
    call_command("migrate", database="owner", verbosity=0)
    assert compare("owner") == []
    with observer() as conn:
        acl = conn.execute("SELECT relacl::text FROM pg_class WHERE relname = 'consumer_offsets'"
                           ).fetchone()[0]
    assert not re.search(r"[{,]=", acl), acl  # no entry for PUBLIC
