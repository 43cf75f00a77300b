"""Create and migrate a database the way docs/roles.md describes (migrate grants).

Used by the test harness (tests/conftest.py) and the benchmarks (bench/).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterator

import psycopg
from django.conf import settings
from django.core.management import call_command
from django.db import connections


def owner_dsn(dbname: str) -> str:
    db = settings.DATABASES["owner"]
    return (
        f"host={db['HOST']} port={db['PORT']} user={db['USER']} "
        f"password={db['PASSWORD']} dbname={dbname}"
    )


@contextlib.contextmanager
def pooler_paused(dbname: str) -> Iterator[None]:
    """Keep the private pgbouncer (if one runs) off ``dbname`` while the block runs.

    pgbouncer keeps server sessions to the test database in its pool after
    their clients have gone (``server_idle_timeout``, 10 minutes), and a pooled
    run's clients come back to it. ``DROP DATABASE ... WITH (FORCE)`` would
    end those sessions behind pgbouncer's back, and pgbouncer could open new
    ones while the database is dropped and created again. Its admin console
    does it cleanly instead: ``KILL`` closes the pool's client and server
    connections to the database and makes new clients wait; ``RESUME`` lets
    them in once the new database is there. (Recreating without DROP
    DATABASE, by emptying the schema, would leave a pooled session's cached
    state and the previous run's objects to reason about; this is shorter.)
    """
    port = os.environ.get("DIO_PGBOUNCER_PORT")
    if not port or not re.fullmatch(r"\w+", dbname):
        yield
        return
    owner = settings.DATABASES["owner"]
    try:
        admin = psycopg.connect(
            host="127.0.0.1", port=port, user=owner["USER"], password=owner["PASSWORD"],
            dbname="pgbouncer", autocommit=True,
        )
    except psycopg.OperationalError:  # a stale DIO_PGBOUNCER_PORT: nothing to pause
        yield
        return
    with admin:
        try:
            admin.execute(f"KILL {dbname}")
        except psycopg.Error:  # "no such database": pgbouncer never served it
            yield
            return
        try:
            yield
        finally:
            admin.execute(f"RESUME {dbname}")


def recreate_database(drop_policies: bool = False) -> None:
    """Drop and create the configured database as the owner, and migrate it as the owner.

    ``migrate`` applies the privileges (``tenancy.privileges``), as it does in
    a deployment; nothing is granted by hand.
    """
    name = settings.DATABASES["default"]["NAME"]
    with pooler_paused(name), psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", database="owner", verbosity=0)
    with connections["owner"].cursor() as cursor:
        if drop_policies:
            # Used only by the sensitivity test: the same suite, without RLS.
            cursor.execute(
                "SELECT format('DROP POLICY %I ON %I', policyname, tablename) FROM pg_policies"
                " UNION ALL SELECT format('ALTER TABLE %I DISABLE ROW LEVEL SECURITY', relname)"
                " FROM pg_class WHERE relrowsecurity"
            )
            for (statement,) in cursor.fetchall():
                cursor.execute(statement)
    if settings.TENANCY.get("VERIFIED_CONTEXT"):
        # What docs/roles.md tells the owner to run: install the key, turn the mode on.
        call_command("verified_context", "add-key", database="owner", stdout=io.StringIO())
        call_command("verified_context", "enable", database="owner", stdout=io.StringIO())
    connections["owner"].close()
