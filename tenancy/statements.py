"""How the library sends its statements: one way, through Django's cursor.

Every statement of the library comes from an app's query file
(:func:`django_idempotency_outbox.sqlfiles.queries`) and goes out through
:func:`execute`: a Django cursor of the alias, so that execute wrappers,
query logging and ``CaptureQueriesContext`` (and the tools built on them)
see it. Nothing is prepared, nothing is kept per connection: the hot
statements call PL/pgSQL functions, whose plans PostgreSQL keeps per server
session where no other SQL can reach them.

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

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections

from tenancy.context import current_tenant_id, prefix, search_path_sql


@contextmanager
def execute(alias: str, sql: str, params: Any = None) -> Iterator[Any]:
    """Send ``sql``, one statement, on ``alias``; the block reads its result from the cursor.

    Outside a tenant context of ``alias`` the pin goes first, in the same
    message (:func:`tenancy.context.prefix`). Inside one the names are pinned
    already.
    """
    if current_tenant_id(alias) is None:
        prefix(alias, search_path_sql(alias))
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        yield cursor


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
