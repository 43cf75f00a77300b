"""How the library sends its statements: one way, through Django's cursor.

Every statement of the library comes from an app's query file
(:func:`django_idempotency_outbox.sqlfiles.queries`) and goes out through
:func:`execute`: a Django cursor of the alias, so that execute wrappers,
query logging and ``CaptureQueriesContext`` (and the tools built on them)
see it. Nothing is prepared: the hot statements call PL/pgSQL functions,
whose plans PostgreSQL keeps per server session where no other SQL can reach
them. Inside a tenant context the statements share one cursor, the
transaction's (:func:`tenancy.context.context_cursor`): making a Django cursor
costs about as much Python as sending a statement.

Names are pinned: a statement sent outside a tenant context (which pins its
transaction's names, :func:`tenancy.context.search_path_sql`) is preceded,
in the same message, by the pin, so that a temporary table or a session's
``search_path`` left by an earlier borrower of the server session cannot
stand in for the library's tables. The library's aliases bind on the client
(Django's default), which sends several statements in one message; each
query-file statement is one statement, so that execute wrappers read its own
result.

:func:`tenancy.context.hold` and :func:`tenancy.context.holding` are the
database backend's held statements (:mod:`tenancy.backends.postgresql`),
where the alias uses it: statements that return nothing travel with the next
one. Elsewhere a held statement is simply sent.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from django.db import connections

from tenancy.context import context_cursor, prefix, search_path_sql


def execute(alias: str, sql: str, params: Any = None) -> AbstractContextManager[Any]:
    """Send ``sql``, one statement, on ``alias``; the block reads its result from the cursor.

    Inside a tenant context of ``alias`` the names are pinned already, and the
    statement goes through the transaction's cursor
    (:func:`tenancy.context.context_cursor`). Outside one the pin goes first,
    in the same message (:func:`tenancy.context.prefix`), on a cursor that
    the block's end closes.
    """
    connection = connections[alias]
    cursor = context_cursor(connection)
    if cursor is not None:
        cursor.execute(sql, params)
        return nullcontext(cursor)
    prefix(alias, search_path_sql(alias))
    cursor = connection.cursor()
    try:
        cursor.execute(sql, params)
    except BaseException:
        cursor.close()
        raise
    return cursor  # Django's cursor: the block's end closes it


def fetch_one(alias: str, sql: str, params: Any = None) -> Any:
    """Send ``sql`` (:func:`execute`); its first row, or None."""
    with execute(alias, sql, params) as cursor:
        return cursor.fetchone()


def fetch_all(alias: str, sql: str, params: Any = None) -> list[Any]:
    """Send ``sql`` (:func:`execute`); every row of its result."""
    with execute(alias, sql, params) as cursor:
        return list(cursor.fetchall())


def affected(alias: str, sql: str, params: Any = None) -> int:
    """Send ``sql`` (:func:`execute`); how many rows it inserted, updated or deleted."""
    with execute(alias, sql, params) as cursor:
        rowcount: int = cursor.rowcount
        return rowcount
