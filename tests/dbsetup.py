"""Create and migrate a database the way docs/roles.md describes (migrate grants).

Used by the test harness (tests/conftest.py) and the benchmarks (bench/).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path

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


#: What a migrated database's schema depends on: the migrations, the SQL files
#: they run and the code their operations call, of the library and of the test
#: app. (What post_migrate applies, the privileges, is applied again on a copy.)
_MIGRATED_FROM = (
    "tenancy/migrations", "tenancy/sql", "tenancy/policies.py", "tenancy/references.py",
    "idempotency/migrations", "idempotency/sql",
    "outbox/migrations", "outbox/sql",
    "django_idempotency_outbox/sqlfiles.py",
    "tests/testapp/migrations", "tests/testapp/sql",
)


def template_name() -> str:
    """The migrated template database of this checkout's code and Django's version.

    ``dio_tmpl_<hash>``: a hash of every ``.py`` and ``.sql`` file the
    migrations run or call (:data:`_MIGRATED_FROM`) and of Django's version,
    so a change to any of them (a new migration, an SQL mutant of ``make
    mutants``) makes another template, never a stale one.
    """
    import django

    digest = hashlib.sha256(django.get_version().encode())
    root = Path(__file__).resolve().parents[1]
    for top in _MIGRATED_FROM:
        found = [root / top] if (root / top).is_file() else (root / top).rglob("*")
        for path in sorted(found):
            if path.suffix in (".py", ".sql") and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode() + b"\0")
                digest.update(path.read_bytes() + b"\0")
    return f"dio_tmpl_{digest.hexdigest()[:20]}"


def recreate_database(drop_policies: bool = False) -> None:
    """Drop and create the configured database as the owner, and migrate it as the owner.

    ``migrate`` applies the privileges (``tenancy.privileges``), as it does in
    a deployment; nothing is granted by hand. The first run of a checkout
    keeps the migrated database as a template (``CREATE DATABASE ...
    TEMPLATE``, :func:`template_name`); the sessions after it (the pooled
    pass, the version matrix, ``make mutants``, another ``make test``) copy
    it and run ``migrate`` again, which finds nothing to migrate and only
    applies what lives outside the database's tables (the database's own
    privileges: ``TEMPORARY``, which a copy does not carry). ``DIO_TEST_TEMPLATE=0``
    migrates from scratch every time.
    """
    name = settings.DATABASES["default"]["NAME"]
    template = template_name() if os.environ.get("DIO_TEST_TEMPLATE", "1") != "0" else None
    with pooler_paused(name), psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        exists = template is not None and conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [template]).fetchone() is not None
        if exists:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        else:
            conn.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", database="owner", verbosity=0)
    if template is not None and not exists:
        _keep_as_template(name, template)
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


def _keep_as_template(name: str, template: str) -> None:
    """Copy the freshly migrated ``name`` as ``template``; drop the templates of older code."""
    connections.close_all()  # CREATE DATABASE ... TEMPLATE wants no session on its source
    with pooler_paused(name), psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
        stale = [row[0] for row in conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'dio\\_tmpl\\_%%'"
            " AND datname <> %s", [template])]
        for old in stale:
            conn.execute(f'DROP DATABASE IF EXISTS "{old}" WITH (FORCE)')
        try:
            conn.execute(f'CREATE DATABASE "{template}" TEMPLATE "{name}"')
        except psycopg.errors.DuplicateDatabase:
            pass  # another session of the same code made it meanwhile
