"""The test harness: a real database, real roles, real commits.

The session starts by recreating the test database as the owner role and
migrating it as the owner, exactly as a deployment would; then it grants the
app and system roles what docs/roles.md grants them. Tests run as the app role
(the ``default`` alias) and nothing wraps them in a transaction: every write
commits, and each test starts from empty tables (truncated by the owner).
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections

from tests.helpers import truncate_all


def _owner_dsn(dbname: str) -> str:
    db = settings.DATABASES["owner"]
    return (
        f"host={db['HOST']} port={db['PORT']} user={db['USER']} "
        f"password={db['PASSWORD']} dbname={dbname}"
    )


GRANTS = (Path(__file__).parent / "grants.sql").read_text()


@pytest.fixture(scope="session")
def django_db_setup(django_db_blocker):
    name = settings.DATABASES["default"]["NAME"]
    with psycopg.connect(_owner_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    with django_db_blocker.unblock():
        call_command("migrate", database="owner", verbosity=0)
        with connections["owner"].cursor() as cursor:
            cursor.execute(
                GRANTS.format(
                    app=settings.DATABASES["default"]["USER"],
                    system=settings.DATABASES["system"]["USER"],
                )
            )
            if os.environ.get("DIO_TEST_DROP_POLICIES"):
                # Used only by the sensitivity test: the same suite, without RLS.
                cursor.execute(
                    "SELECT format('DROP POLICY %I ON %I', policyname, tablename) FROM pg_policies"
                    " UNION ALL SELECT format('ALTER TABLE %I DISABLE ROW LEVEL SECURITY', relname)"
                    " FROM pg_class WHERE relrowsecurity"
                )
                for (statement,) in cursor.fetchall():
                    cursor.execute(statement)
        connections["owner"].close()


@pytest.fixture(autouse=True)
def _database(django_db_setup, django_db_blocker):
    """Every test may use the database; none is wrapped in a transaction."""
    with django_db_blocker.unblock():
        yield
        for conn in connections.all():
            if conn.alias != "owner" and conn.connection is not None and conn.in_atomic_block:
                raise AssertionError(f"test left a transaction open on {conn.alias!r}")
        truncate_all()
