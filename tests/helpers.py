"""Helpers that make tests read like their claims."""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

import psycopg
import pytest
from django.conf import settings
from django.db import connections

#: Generous: waits end as soon as their condition holds. They exist because a
#: transaction open elsewhere on the server (another test database) may hold
#: the outbox's delivery fence back for a moment; nothing here measures time.
PATIENCE = 60.0


def unavailable(reason: str) -> NoReturn:
    """Skip the test: ``reason`` names what it needs that is not there (a service, a file).

    In CI (``CI`` set, as .ci/run sets it) the test fails instead: CI must not pass
    with a test that could not run.
    """
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: a test that cannot run fails)", pytrace=False)
    pytest.skip(reason)


def wait_for(predicate: Callable[[], bool], what: str, patience: float = PATIENCE) -> None:
    """Until ``predicate()`` holds (polled every 50 ms); fails naming ``what`` after ``patience``
    seconds."""
    deadline = time.monotonic() + patience
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def lock_waits(alias: str) -> int:
    """How many sessions of ``alias``'s role wait for a lock now (``pg_stat_activity``)."""
    role = settings.DATABASES[alias]["USER"]
    with observer() as conn:
        return int(conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s"
            " AND datname = current_database() AND wait_event_type = 'Lock'", [role],
        ).fetchone()[0])


def wait_for_lock_wait(alias: str) -> None:
    """Until a session of ``alias``'s role waits for a lock."""
    wait_for(lambda: lock_waits(alias) > 0,
             f"a session of {settings.DATABASES[alias]['USER']} to wait for a lock")


#: Apps whose tables are emptied after every test.
TRUNCATED_APPS = {"idempotency", "outbox", "testapp"}


def truncate_all() -> None:
    """Empty the tables of ``TRUNCATED_APPS`` and restart their sequences, as
    ``TRUNCATE ... RESTART IDENTITY`` of them all would.

    Only the tables a test used are truncated: those a row was written to (even
    one rolled back) or whose sequence handed out a value. A TRUNCATE costs
    about 2 ms a table even when the table is empty (new files for it and its
    indexes), and most tests touch two or three of them.
    """
    with connections["owner"].cursor() as cursor:
        cursor.execute("SET lock_timeout = '10s'")
        cursor.execute(_used_tables_query())
        used = [name for (name,) in cursor.fetchall()]
        if used:
            # CASCADE: also the empty tables whose foreign keys point at these.
            cursor.execute(f"TRUNCATE {', '.join(used)} RESTART IDENTITY CASCADE")
        # The one row of a table without a model: a lease a test left held.
        cursor.execute("UPDATE idempotency_leases SET owner = '', until = NULL"
                       " WHERE owner <> '' OR until IS NOT NULL")
    connections["owner"].close()


@functools.cache
def _used_tables_query() -> str:
    """One statement naming the tables of ``TRUNCATED_APPS`` that a row was written to
    since they were last emptied (their size: a count would see only what row-level
    security lets the owner see) or whose own sequences, the ones RESTART IDENTITY
    restarts, handed out a value."""
    from django.apps import apps

    owner = connections["owner"]
    tests = []
    with owner.cursor() as cursor:
        for table in sorted({m._meta.db_table for m in apps.get_models()
                             if m._meta.app_label in TRUNCATED_APPS}):
            used = [f"pg_relation_size('{table}') > 0"] + [
                f"(SELECT is_called FROM {seq['name']})"
                for seq in owner.introspection.get_sequences(cursor, table)]
            tests.append(f"('{table}', {' OR '.join(used)})")
    return f"SELECT name FROM (VALUES {', '.join(tests)}) AS t(name, used) WHERE used"


def app_connection():
    """Django's connection on the app alias (``TENANCY["APP_DATABASE"]``), whatever its name."""
    from tenancy.aliases import app_alias

    return connections[app_alias()]


def app_role() -> str:
    """The web process's role, as the app alias logs in."""
    from django.conf import settings

    from tenancy.aliases import app_alias

    return settings.DATABASES[app_alias()]["USER"]


def app_atomic():
    """``transaction.atomic()`` on the app alias."""
    from django.db import transaction

    from tenancy.aliases import app_alias

    return transaction.atomic(using=app_alias())


@contextlib.contextmanager
def statements(alias: str | None = None) -> Iterator[list[str]]:
    """The SQL that Django sends on ``alias`` (the app alias) inside the block, in order.

    Installed outermost, it sees every statement as the library issues it,
    before any wrapper of the library merges statements into one round trip.
    """
    from tenancy.aliases import app_alias

    sent: list[str] = []

    def capture(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connections[app_alias(alias)].execute_wrapper(capture):
        yield sent


@contextlib.contextmanager
def statements_on_every_alias() -> Iterator[list[tuple[str, str]]]:
    """``(alias, sql)`` of every statement Django sends on any alias inside the block."""
    sent: list[tuple[str, str]] = []
    with contextlib.ExitStack() as stack:
        for alias in settings.DATABASES:
            def capture(execute, sql, params, many, context, alias=alias):
                sent.append((alias, sql))
                return execute(sql, params, many, context)

            stack.enter_context(connections[alias].execute_wrapper(capture))
        yield sent


def dsn(alias: str = "default") -> str:
    db = settings.DATABASES[alias]
    return (
        f"host={db['HOST']} port={db['PORT']} user={db['USER']} "
        f"password={db['PASSWORD']} dbname={db['NAME']}"
    )


def connect(alias: str = "default", **kwargs) -> psycopg.Connection:
    """A raw psycopg connection as the role of ``alias`` (default: the app role).

    It connects where the alias does (through pgbouncer when the alias is
    pooled) and takes the alias's ``OPTIONS`` (no prepared statements there).
    """
    return psycopg.connect(dsn(alias), **{**settings.DATABASES[alias].get("OPTIONS", {}), **kwargs})


@contextlib.contextmanager
def two_connections(
    alias: str = "default",
) -> Iterator[tuple[psycopg.Connection, psycopg.Connection]]:
    """Two independent sessions, as two web workers would have."""
    with connect(alias) as first, connect(alias) as second:
        yield first, second


def set_tenant(conn: psycopg.Connection, tenant_id: int) -> None:
    """Set the tenant in a raw connection's open transaction, as ``tenant_context`` does.

    In the verified mode (``DIO_VERIFIED_CONTEXT=1``) that is also a token
    minted for this transaction with the settings' key.
    """
    from tenancy.conf import tenancy_settings
    from tenancy.context import mint_token

    conn.execute(f"SET LOCAL app.tenant_id = '{int(tenant_id)}'")
    key = tenancy_settings.VERIFIED_CONTEXT
    if key is not None:
        binding = conn.execute("SELECT tenancy_context_binding()").fetchone()[0]
        conn.execute("SELECT set_config('app.tenant_token', %s, true)",
                     [mint_token(key, tenant_id, binding)])


@contextlib.contextmanager
def as_tenant(conn: psycopg.Connection, tenant_id: int | None) -> Iterator[psycopg.Cursor]:
    """A transaction on a raw connection with the tenant set locally (:func:`set_tenant`)."""
    with conn.transaction(), conn.cursor() as cursor:
        if tenant_id is not None:
            set_tenant(conn, tenant_id)
        yield cursor


def raises_rls_violation():
    """The error PostgreSQL raises when a row breaks a policy's WITH CHECK."""
    return pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security")


def superuser(database: str | None = None) -> psycopg.Connection:
    """A direct superuser session (autocommit) on ``database`` (default: the test database).

    Direct even when the app alias is pooled: it goes where the owner alias
    goes, the one alias that is never behind pgbouncer.
    """
    import os

    db = settings.DATABASES["owner"]
    socket_dir = os.environ.get("DIO_PGSOCKET") or db["HOST"]
    return psycopg.connect(host=socket_dir, port=db["PORT"], user="postgres",
                           dbname=database or db["NAME"], autocommit=True)


def observer() -> psycopg.Connection:
    """A superuser connection for assertions only: it sees every tenant's rows.

    The code under test never uses it; it stands outside, counting.
    """
    return superuser()


def server_pid(conn: psycopg.Connection) -> int:
    """The PID of the server process serving ``conn``'s current transaction.

    Not ``conn.info.backend_pid``: behind pgbouncer that is the pooler's
    number, not a server's. Inside a transaction the pooler keeps one server
    session, so this is the PID that pg_locks and pg_stat_activity show.
    """
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def documented_sql(page: str, heading: str) -> str:
    """The first ```sql block under ``heading`` (a line of docs/``page``), as the page shows it."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / page).read_text()
    after = text[text.index(f"\n{heading}\n"):]
    return after.split("```sql\n", 1)[1].split("```", 1)[0]


def count_rows(table: str, where: str = "TRUE") -> int:
    """Rows in ``table`` across all tenants, as the observer sees them."""
    with observer() as conn:
        return conn.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()[0]
