"""The one way to set the tenant of a transaction."""

from __future__ import annotations

import hashlib
import hmac
import threading
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from decimal import Decimal
from typing import Any

from django.db import connections, transaction
from django.db.backends.utils import CursorDebugWrapper

from django_idempotency_outbox.errors import ConfigurationError
from django_idempotency_outbox.sqlfiles import queries
from tenancy.aliases import tenant_alias
from tenancy.backends.postgresql.base import DatabaseWrapper
from tenancy.conf import ContextKey, tenancy_settings

#: tenancy's statements, by name (tenancy/queries.sql).
SQL = queries("tenancy")

#: The PostgreSQL setting that the row-level security policies compare with.
GUC = "app.tenant_id"

#: The setting that carries the tenant's token in the verified mode
#: (``TENANCY["VERIFIED_CONTEXT"]``, docs/roles.md).
TOKEN_GUC = "app.tenant_token"

_BIGINT_MIN = -(2**63)
_BIGINT_MAX = 2**63 - 1


def validate_tenant_id(tenant_id: Any) -> int:
    """Return ``tenant_id`` if it is a usable tenant id, else raise.

    Tenant ids are integers in PostgreSQL's ``bigint`` range. Booleans,
    strings and floats are refused rather than coerced: a tenant id that
    arrives as the wrong type is a bug worth hearing about.
    """
    if isinstance(tenant_id, bool) or not isinstance(tenant_id, int):
        raise TypeError(f"tenant id must be an int, not {type(tenant_id).__name__}")
    if not _BIGINT_MIN <= tenant_id <= _BIGINT_MAX:
        raise ValueError(f"tenant id {tenant_id} is outside PostgreSQL's bigint range")
    return int(tenant_id)


class _Contexts:
    """A connection wrapper's open tenant contexts: their tenants, innermost last, and
    the Django cursor the library's statements share inside them (closed when the
    first context leaves)."""

    __slots__ = ("stack", "cursor")

    def __init__(self) -> None:
        self.stack: list[int] = []
        self.cursor: Any = None


#: Per connection wrapper (Django's wrappers are per thread). Weak keys: a
#: closed-and-dropped wrapper takes its contexts with it.
_contexts: weakref.WeakKeyDictionary[Any, _Contexts] = weakref.WeakKeyDictionary()
_contexts_lock = threading.Lock()


def _open(connection: Any) -> _Contexts:
    contexts = _contexts.get(connection)
    if contexts is None:
        with _contexts_lock:
            contexts = _contexts.setdefault(connection, _Contexts())
    return contexts


def context_cursor(connection: Any) -> Any:
    """The cursor for the library's statements inside a :func:`tenant_context`, or None outside one.

    One Django cursor per transaction rather than one per statement (making a
    cursor costs about as much Python as sending a statement): execute
    wrappers and query logging see every statement as they would on a new
    cursor, because a new one is made whenever Django would make another
    kind (``CaptureQueriesContext`` entered, the connection opened anew).
    """
    if not connection.in_atomic_block:
        return None
    contexts = _open(connection)
    if not contexts.stack:
        return None
    cursor = contexts.cursor
    if (cursor is None or cursor.cursor.closed
            or cursor.cursor.connection is not connection.connection
            or isinstance(cursor, CursorDebugWrapper) != connection.queries_logged):
        cursor = contexts.cursor = connection.cursor()
    return cursor


def _close_cursor(connection: Any) -> None:
    contexts = _contexts.get(connection)
    if contexts is None:
        return
    cursor, contexts.cursor = contexts.cursor, None
    if cursor is not None:
        with suppress(connection.Database.Error):  # as Django's cursor does on leaving a block
            cursor.close()


def set_tenant_sql(tenant_id: int | None) -> str:
    """The one statement that sets the tenant of a transaction (None: no tenant).

    ``SET LOCAL``, not ``set_config()``: Citus forwards ``SET LOCAL`` to its
    workers, and ``SET`` takes no bind parameters, so the value is a
    validated integer literal. :func:`tenant_context` sends it; a caller that
    sends it with other statements in one message (the replay lookup of
    :func:`idempotency.store.peek`) sets the tenant for that message's
    transaction only.
    """
    value = "" if tenant_id is None else str(validate_tenant_id(tenant_id))
    return f"SET LOCAL {GUC} = '{value}'"


#: Per alias and what it connects to (:func:`_target`): the schemas the
#: library's tenant transactions pin their names to (see
#: :func:`search_path_sql`); per list of schemas, the statement.
_schemas: dict[tuple[str, ...], tuple[str, ...]] = {}
_pins: dict[tuple[str, ...], str] = {}


def _target(connection: Any) -> tuple[str, ...]:
    """An alias and what it connects to: another host, port, database or role is probed anew."""
    settings_dict = connection.settings_dict
    return (connection.alias, *(str(settings_dict.get(name)) for name in
                                 ("HOST", "PORT", "NAME", "USER")))

def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def search_path_sql(using: str) -> str:
    """The statement that pins a transaction's names to the migrations' schema.

    ``SET LOCAL search_path = "public", pg_temp`` (for the usual default):
    the schemas of the search_path that sessions of ``using`` start with,
    those that exist, in order, with ``pg_temp`` named explicitly and last.
    Unnamed, ``pg_temp`` is searched *first* for tables: a temporary table
    called ``idempotency_keys``, left in a pooled server session by an
    earlier borrower (or an earlier request on a persistent connection),
    would take the place of the library's table for every later borrower.
    Named last, it is reached only for names that no schema before it has
    (pg_catalog stays first, as it is when unnamed; functions and operators
    are never looked up in ``pg_temp``). A session-level ``SET search_path``
    left behind does not matter either: the statement is transaction-local
    and names its schemas itself.

    Derived once per alias (its host, port, database and role) and process,
    from what the session started with (``SET LOCAL search_path TO
    DEFAULT``), never from what it may have been set to since. Sent with the
    next statement: the tenant's in :func:`tenant_context`, the statement's
    own elsewhere (:func:`tenancy.statements.execute`): no extra round trip.

    Raises:
        ConfigurationError: the default search_path names no schema that exists.
    """
    schemas = pinned_schemas(using)
    pin = _pins.get(schemas)
    if pin is None:
        pin = _pins[schemas] = (
            f"SET LOCAL search_path = {', '.join(_quote(s) for s in schemas)}, pg_temp"
        )
    return pin


def pinned_schemas(using: str) -> tuple[str, ...]:
    """The schemas :func:`search_path_sql` pins ``using``'s names to, in order (pg_temp aside).

    For the few statements that must name a schema rather than search one
    (the catalog queries of :mod:`tenancy.db`).

    Raises:
        ConfigurationError: the default search_path names no schema that exists.
    """
    connection = connections[using]
    key = _target(connection)
    schemas = _schemas.get(key)
    if schemas is None:
        schemas = tuple(s for s in _default_schemas(connection)
                        if s != "pg_catalog" and not s.startswith(("pg_temp_", "pg_toast_temp_")))
        if not schemas:
            raise ConfigurationError(
                f"The default search_path of database alias {using!r} names no schema that "
                "exists: the library's tables cannot be found (docs/roles.md)."
            )
        _schemas[key] = schemas
    return schemas


def _default_schemas(connection: Any) -> list[str]:
    """The schemas sessions of ``connection`` start with, in order.

    In autocommit the probe is a transaction of its own; inside one, a
    savepoint's, rolled back: its ``SET LOCAL`` must not outlive it.
    """
    connection.ensure_connection()
    savepoint = transaction.savepoint(using=connection.alias)
    try:
        with connection.cursor() as cursor:  # one message: in autocommit, one transaction
            cursor.execute("; ".join((SQL["default_search_path"], SQL["current_schemas"])))
            cursor.nextset()
            return [row[0] for row in cursor.fetchall()]
    finally:
        if savepoint is not None:
            transaction.savepoint_rollback(savepoint, using=connection.alias)


def pin_search_path(sender: Any = None, connection: Any = None, **kwargs: Any) -> None:
    """``connection_created``: derive the pinned search_path of the app and worker aliases.

    Connected by ``TenancyConfig.ready()``, so that the one query it costs
    runs as a connection opens, in autocommit, not in the middle of the first
    request's transaction. Other aliases derive theirs on first use.
    """
    if connection is None:
        return
    aliases = {tenancy_settings.APP_DATABASE, tenancy_settings.WORKER_DATABASE}
    if connection.alias in aliases:
        search_path_sql(connection.alias)


#: Per connection wrapper: what the tokens of its open contexts are bound to
#: (the transaction's binding, read when its first context opened).
_bindings: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def mint_token(key: ContextKey, tenant_id: int, binding: str) -> str:
    """The token that names ``tenant_id`` in the transaction ``binding`` identifies.

    ``<tenant>.<key id>.<hex HMAC-SHA256(key, "v1.<tenant>.<binding>")>``,
    where ``binding`` is what ``tenancy_context_binding()`` returned inside
    that transaction (the server process and the transaction's start). The
    database's ``tenancy_verified_tenant()`` recomputes it; a token is
    worthless in any other transaction.
    """
    tenant = str(validate_tenant_id(tenant_id))
    mac = hmac.new(key.secret, f"v1.{tenant}.{binding}".encode(), hashlib.sha256).hexdigest()
    return f"{tenant}.{key.key_id}.{mac}"


def _binding(pid: Any, epoch: Any) -> str:
    # epoch is numeric with six decimals: exact in Decimal, as in the SQL function
    return f"{int(pid)}.{int(Decimal(str(epoch)) * 1_000_000)}"


def read_binding(connection: Any) -> str:
    """The current transaction's binding: what tenancy_context_binding() returns inside it.

    The first statement of its transaction: on the library's backend, the
    transaction's ``BEGIN`` travels with it (:func:`tenant_context` holds it),
    so the verified mode costs no round trip more than the plain one.
    """
    with connection.cursor() as cursor:
        cursor.execute(SQL["binding"])
        row = cursor.fetchone()
    assert row is not None  # one row
    return _binding(*row)


def _set(connection: Any, tenant_id: int | None, *, fresh: bool = False) -> None:
    # The first context of a transaction pins its names too (search_path_sql),
    # in the same statement: contexts inside it find the path pinned already.
    # Held where the backend holds (hold()): they travel with the next statement.
    alias = connection.alias
    pin = [search_path_sql(alias)] if fresh else []
    key = tenancy_settings.VERIFIED_CONTEXT
    if key is None:
        hold(alias, set_tenant_sql(tenant_id), *pin)
        return
    value = "" if tenant_id is None else str(validate_tenant_id(tenant_id))
    # The verified mode: the token, bound to this transaction, is what the
    # policies trust; app.tenant_id is still set, for code that reads it. The
    # token is digits, a key id ([A-Za-z0-9_-]) and hex: a safe literal.
    if fresh or connection not in _bindings:
        _bindings[connection] = read_binding(connection)
    token = "" if tenant_id is None else mint_token(key, tenant_id, _bindings[connection])
    hold(alias, f"SET LOCAL {GUC} = '{value}'", f"SET LOCAL {TOKEN_GUC} = '{token}'", *pin)


def _backend(alias: str) -> DatabaseWrapper | None:
    """The alias's connection if it uses the library's backend, which holds statements."""
    connection = connections[alias]
    return connection if isinstance(connection, DatabaseWrapper) else None


def hold(alias: str, *statements: str) -> None:
    """Send ``statements``, which return nothing, now (in one message) or, while holding,
    with the next statement.

    See :mod:`tenancy.backends.postgresql`; on an alias of another backend they
    are sent at once.
    """
    backend = _backend(alias)
    if backend is not None:
        backend.hold(*statements)
        return
    with connections[alias].cursor() as cursor:
        cursor.execute("; ".join(statements))


def prefix(alias: str, sql: str) -> None:
    """Send ``sql``, which returns nothing, with the next statement, in its transaction.

    On another backend than the library's it is sent at once inside a
    transaction, and not at all in autocommit (where it would end at once).
    """
    backend = _backend(alias)
    if backend is not None:
        backend.prefix(sql)
        return
    connection = connections[alias]
    if connection.in_atomic_block or not connection.get_autocommit():
        with connection.cursor() as cursor:
            cursor.execute(sql)


def holds_statements(alias: str) -> bool:
    """Whether ``alias`` uses the backend that holds statements (tenancy.backends.postgresql)."""
    return _backend(alias) is not None


def is_holding(alias: str) -> bool:
    """Whether ``alias`` holds what returns nothing now (:func:`holding`)."""
    backend = _backend(alias)
    return backend is not None and backend.held.on


def holding(alias: str, on: bool = True) -> AbstractContextManager[None]:
    """While the block runs, hold (or, not ``on``, send at once) what returns nothing.

    See :mod:`tenancy.backends.postgresql`; nothing on an alias of another backend.
    """
    backend = _backend(alias)
    return nullcontext() if backend is None else backend.holding(on)


@contextmanager
def tenant_context(tenant_id: int, *, using: str | None = None) -> Iterator[int]:
    """Run a block as ``tenant_id``, inside ``transaction.atomic()``.

    The tenant is set with ``SET LOCAL``, so it ends with the transaction and
    never leaks to the next user of a pooled connection. Contexts nest: on
    leaving an inner one, the outer tenant (or no tenant) is restored, because
    a transaction-local setting survives the release of a savepoint.

    A context for the tenant that is already in force (the innermost open
    context is for the same tenant) opens only its savepoint: the setting is
    not sent again, and nothing is restored on leaving it.

    Example::

        with tenant_context(42):
            Order.objects.create(...)   # RLS sees tenant 42 only

    Args:
        tenant_id: the tenant, an int in PostgreSQL's bigint range.
        using: database alias; when omitted, ``TENANCY["APP_DATABASE"]`` (the
            worker alias inside a consumer's batch, ``tenancy.aliases.tenant_alias``).

    Raises:
        TypeError, ValueError: ``tenant_id`` is not a valid tenant id.
    """
    tenant_id = validate_tenant_id(tenant_id)
    alias = tenant_alias(using)
    connection = connections[alias]
    outermost = not connection.in_atomic_block
    # The verified mode's first statement reads the transaction's binding:
    # BEGIN, held, travels with it, and the token's SET LOCALs with the
    # caller's first statement. The block holds what its caller holds.
    caller_holds = is_holding(alias)
    opening = outermost and tenancy_settings.VERIFIED_CONTEXT is not None
    first = True
    try:
        with holding(alias, caller_holds or opening), transaction.atomic(using=alias):
            stack = _open(connection).stack
            if outermost:
                stack.clear()  # left over from a transaction that ended under us
            first = not stack
            previous = stack[-1] if stack else None
            switch = previous != tenant_id
            if switch:
                # The first context of a transaction reads its binding afresh;
                # contexts inside it share that transaction, and the binding.
                _set(connection, tenant_id, fresh=first)
            stack.append(tenant_id)
            try:
                with holding(alias, caller_holds):
                    yield tenant_id
            except BaseException:
                # Our atomic block rolls back; the setting reverts with it.
                stack.pop()
                raise
            stack.pop()
            if switch and not outermost and not connection.needs_rollback:
                _set(connection, previous)
    finally:
        if first:
            _close_cursor(connection)


def current_tenant_id(using: str | None = None) -> int | None:
    """The tenant set by the innermost open :func:`tenant_context`, or None."""
    return tenant_of(connections[tenant_alias(using)])


def tenant_of(connection: Any) -> int | None:
    """:func:`current_tenant_id` of a connection wrapper the caller holds already."""
    if not connection.in_atomic_block:
        return None
    stack = _open(connection).stack
    return stack[-1] if stack else None
