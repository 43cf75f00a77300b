"""How the library sends the statements of its hot paths: cheaply, and leaving nothing behind.

Two costs dominate a short statement sent through Django (docs/benchmarks.md
has the measurements): on the client, a new psycopg cursor for each
statement, whose adapters psycopg looks up afresh for every parameter; on
the server, parsing and planning the statement again every time. So the
few statements on the hot paths (the key's read, claim and store; a
message's INSERT) go through:

- :func:`cursor`: one psycopg cursor per connection, made by Django's own
  ``create_cursor()`` and kept for the connection's life, wrapped by Django
  for each use exactly as ``connection.cursor()`` wraps a new one, so that
  execute wrappers, query logging and ``CaptureQueriesContext`` see every
  statement. Only for statements whose rows hold no timestamps: the kept
  cursor keeps the time zone it was made with.
- :class:`Statement`: a statement's text, and its prepared form. On an alias
  that is not pooled (:func:`tenancy.context.pooled`), a statement is
  prepared (SQL ``PREPARE``) by the message that first sends it on a
  connection, and sent as ``EXECUTE`` from then on. SQL-level, not the
  protocol's: ``EXECUTE`` is a statement like any other, so ``SET LOCAL``,
  ``SAVEPOINT``, ``BEGIN`` and ``COMMIT`` still travel with it in one
  simple-query message. A name is the statement's purpose and a hash of its
  text: one name has one meaning, in every process of every release.

What the library records per server session (:func:`state`) is what it
knows for sure: prepared, or "send as text" after a message that prepared
failed (whether its ``PREPARE`` ran is then unknown; a second ``PREPARE``
of the name would fail, and so would an ``EXECUTE`` of a name that is not
there). A session whose statements someone deallocated (``DEALLOCATE ALL``,
``DISCARD ALL``) is forgotten when an ``EXECUTE`` finds the name gone
(:func:`forget_if_gone`): the next message prepares again.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections
from django.utils.asyncio import async_unsafe

from tenancy.context import pooled

#: A parameter in the text of a statement, ``%(name)s`` or ``%s``; or ``%%``, a
#: percent sign, left as it is (``prepare`` and ``call`` are bound like ``sql``).
_PARAMETER = re.compile(r"%%|%\((\w+)\)s|%s")


@dataclass(frozen=True, slots=True)
class Statement:
    """One of the library's hot statements: its text, and its prepared form.

    Attributes:
        sql: the statement with its placeholders (``%(name)s``, or ``%s``),
            bound on the client.
        name: the prepared statement's name: purpose and a hash of ``sql``.
        prepare: ``PREPARE name (types) AS`` the statement, with ``$1``,
            ``$2``... for its parameters (no placeholder left to bind).
        call: ``EXECUTE name(...)``, with the same placeholders as ``sql``
            (bound with the same parameters).
    """

    sql: str
    name: str
    prepare: str
    call: str

    @classmethod
    def of(cls, purpose: str, sql: str, types: Mapping[str, str] | Sequence[str]) -> Statement:
        """The statement ``sql``, its parameters typed by ``types``: by name, or in order."""
        order: list[str] = []
        named = isinstance(types, Mapping)

        def number(match: re.Match[str]) -> str:
            if match.group(0) == "%%":
                return "%%"
            param = match.group(1) if named else str(len(order))
            if param not in order:
                order.append(param)
            return f"${order.index(param) + 1}"

        body = _PARAMETER.sub(number, sql).strip()
        name = f"{purpose}_{hashlib.sha256(sql.encode()).hexdigest()[:12]}"
        if isinstance(types, Mapping):
            typed = ", ".join(types[param] for param in order)
            args = ", ".join(f"%({param})s" for param in order)
        else:
            if len(types) != len(order):
                raise ValueError(f"{purpose}: {len(order)} parameters, {len(types)} types")
            typed, args = ", ".join(types), ", ".join("%s" for _ in order)
        return cls(sql, name, f"PREPARE {name} ({typed}) AS {body}", f"EXECUTE {name}({args})")


#: Per connection (psycopg's: one per server session): each statement's state
#: there, True: prepared; False: sent as text (a message that prepared it failed).
_sessions: weakref.WeakKeyDictionary[Any, dict[str, bool]] = weakref.WeakKeyDictionary()

#: Per Django connection (one per alias and thread, for the thread's life): the
#: psycopg cursor :func:`cursor` keeps, made on the psycopg connection it has
#: now. Keyed on Django's wrapper, not on psycopg's connection: a cursor holds
#: its connection, so a dict keyed on the connection would keep every one the
#: process ever opened (each request's, with ``CONN_MAX_AGE = 0``).
_cursors: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def state(cursor: Any, statement: Statement) -> bool | None:
    """What the session of ``cursor`` (a Django cursor) has of ``statement``.

    True: prepared; False: to be sent as text; None: nothing yet.
    """
    return _sessions.get(cursor.cursor.connection, {}).get(statement.name)


def may_prepare(cursor: Any, alias: str) -> bool:
    """Whether ``cursor``'s session may be given prepared statements.

    Not on a pooled alias (the next borrower of the session would find them),
    and only on a cursor that binds on the client (which sends the PREPARE
    and the statements around it in one message).
    """
    return isinstance(cursor.cursor, psycopg.ClientCursor) and not pooled(alias)


def record(cursor: Any, statements: tuple[Statement, ...], prepared: bool) -> None:
    """Note what a message that prepared ``statements`` left: prepared, or unknown (text)."""
    known = _sessions.setdefault(cursor.cursor.connection, {})
    for statement in statements:
        known[statement.name] = prepared


def forget_if_gone(cursor: Any, exc: BaseException) -> bool:
    """After a failed statement: True if it failed because a prepared statement is gone.

    Something deallocated the session's statements; the session is
    forgotten, so that the next message prepares them again. Or a column of
    a prepared statement's result changed type (a migration, while the
    connection stayed open): the session's statements are sent as text from
    then on.
    """
    cause, session = exc.__cause__, cursor.cursor.connection
    if isinstance(cause, psycopg.errors.InvalidSqlStatementName):
        _sessions.pop(session, None)
        return True
    if isinstance(cause, psycopg.errors.FeatureNotSupported) and _sessions.get(session):
        # "cached plan must not change result type": a column of a prepared
        # statement's result changed type since the session prepared it (a
        # migration). PostgreSQL refuses that EXECUTE for the session's life;
        # the session sends the statements as text from now on.
        known = _sessions[session]
        for name in known:
            known[name] = False
        return True
    return False


def select_result(cursor: Any, index: int) -> None:
    """Leave a psycopg cursor on result ``index`` (negative: from the end) of its last message.

    ``Cursor.set_result()`` where psycopg has it; before it (the oldest
    psycopg the library supports), ``nextset()`` as many times as it takes,
    counted from the cursor's results.
    """
    if hasattr(cursor, "set_result"):
        cursor.set_result(index)
        return
    for _ in range(index % len(cursor._results)):
        cursor.nextset()


@async_unsafe
def cursor(alias: str) -> Any:
    """A Django cursor on ``alias`` around the psycopg cursor kept for its connection.

    What ``connections[alias].cursor()`` does (the health check, connecting
    if need be, Django's wrapping: execute wrappers, query logging), but
    with the connection's kept psycopg cursor instead of a new one. Do not
    close it (nor use it in a ``with`` block, which closes it).
    """
    connection = connections[alias]
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    kept = _cursors.get(connection)
    if kept is None or kept.closed or kept.connection is not connection.connection:
        with connection.wrap_database_errors:
            kept = _cursors[connection] = connection.create_cursor()
    connection.validate_thread_sharing()
    if connection.queries_logged:
        return connection.make_debug_cursor(kept)
    return connection.make_cursor(kept)
