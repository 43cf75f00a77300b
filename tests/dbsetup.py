"""Create, migrate and grant a database the way docs/roles.md describes.

Used by the test harness (tests/conftest.py) and the benchmarks (bench/).
"""

from __future__ import annotations

from pathlib import Path

import psycopg
from django.conf import settings
from django.core.management import call_command
from django.db import connections

GRANTS = (Path(__file__).parent / "grants.sql").read_text()


def owner_dsn(dbname: str) -> str:
    db = settings.DATABASES["owner"]
    return (
        f"host={db['HOST']} port={db['PORT']} user={db['USER']} "
        f"password={db['PASSWORD']} dbname={dbname}"
    )


def recreate_database(drop_policies: bool = False) -> None:
    """Drop and create the configured database as the owner, migrate, grant."""
    name = settings.DATABASES["default"]["NAME"]
    with psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", database="owner", verbosity=0)
    with connections["owner"].cursor() as cursor:
        cursor.execute(
            GRANTS.format(
                app=settings.DATABASES["default"]["USER"],
                system=settings.DATABASES["system"]["USER"],
            )
        )
        if drop_policies:
            # Used only by the sensitivity test: the same suite, without RLS.
            cursor.execute(
                "SELECT format('DROP POLICY %I ON %I', policyname, tablename) FROM pg_policies"
                " UNION ALL SELECT format('ALTER TABLE %I DISABLE ROW LEVEL SECURITY', relname)"
                " FROM pg_class WHERE relrowsecurity"
            )
            for (statement,) in cursor.fetchall():
                cursor.execute(statement)
    connections["owner"].close()
