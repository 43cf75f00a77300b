"""The one way to set the tenant of a transaction."""

from __future__ import annotations

import hashlib
import hmac
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import psycopg
from django.db import connections, transaction

from django_idempotency_outbox.errors import ConfigurationError
from tenancy.aliases import tenant_alias
from tenancy.conf import ContextKey, tenancy_settings

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


#: The tenants of the open contexts, innermost last, per connection wrapper
#: (Django's wrappers are per thread). Weak keys: a closed-and-dropped
#: wrapper takes its stack with it.
_stacks: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()
_stacks_lock = threading.Lock()


def _stack(connection: Any) -> list[int]:
    stack = _stacks.get(connection)
    if stack is None:
        with _stacks_lock:
            stack = _stacks.setdefault(connection, [])
    return stack


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

#: Per alias and what it connects to: whether the same probe found a pooler
#: between the alias and the server (see :func:`pooled`).
_behind_pooler: dict[tuple[str, ...], bool] = {}


def _target(connection: Any) -> tuple[str, ...]:
    """An alias and what it connects to: another host, port, database or role is probed anew."""
    settings_dict = connection.settings_dict
    return (connection.alias, *(str(settings_dict.get(name)) for name in
                                 ("HOST", "PORT", "NAME", "USER")))

#: The schemas of the search_path the session started with, whatever it has
#: been SET to since (a session-level SET left by an earlier borrower of a
#: pooled server session): ``TO DEFAULT`` is the value the session started
#: with (the server's, the database's or the role's default, the startup
#: packet's), for this message's implicit transaction only. Every name is
#: pg_catalog's, qualified, so that the session's own search_path cannot
#: redirect this query either.
_DEFAULT_SCHEMAS = (
    b"SET LOCAL search_path TO DEFAULT; "
    b"SELECT s, pg_catalog.pg_backend_pid()"
    b" FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) AS s"
)


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
    from what the session started with, never from what it may have been set
    to since (:data:`_DEFAULT_SCHEMAS`); :func:`tenant_context` sends it with the
    tenant, :func:`idempotency.store.peek` with its lookup, and a consumer's
    batch with the lock of its offset row: no extra round trip.

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
        found, server_pid = _default_schemas(connection)
        # The same probe tells whether a pooler stands between this alias and
        # the server (see pooled()).
        login_pid = connection.connection.info.backend_pid
        _behind_pooler[key] = server_pid is not None and server_pid != login_pid
        schemas = tuple(s for s in found
                        if s != "pg_catalog" and not s.startswith(("pg_temp_", "pg_toast_temp_")))
        if not schemas:
            raise ConfigurationError(
                f"The default search_path of database alias {using!r} names no schema that "
                "exists: the library's tables cannot be found (docs/roles.md)."
            )
        _schemas[key] = schemas
    return schemas


def execute_pinned(cursor: Any, using: str, sql: str, params: Any = None) -> None:
    """Run ``sql`` on a Django cursor of ``using`` after :func:`search_path_sql`.

    For a transaction's first statement outside :func:`tenant_context` (a
    consumer batch's lock of its offset row). One message on a cursor that
    binds on the client (Django's default), and the cursor is left on
    ``sql``'s result; two where the server binds (no multi-statement query).
    """
    pin = search_path_sql(using)
    if isinstance(cursor.cursor, psycopg.ClientCursor):
        escaped = pin if params is None else pin.replace("%", "%%")
        cursor.execute(f"{escaped}; {sql}", params)
        cursor.nextset()
    else:
        cursor.execute(pin)
        cursor.execute(sql, params)


def _default_schemas(connection: Any) -> tuple[list[str], int | None]:
    """The schemas sessions of ``connection`` start with, and the server process's id."""
    connection.ensure_connection()
    raw = connection.connection
    with connection.wrap_database_errors, raw.lock:
        result = raw.pgconn.exec_(_DEFAULT_SCHEMAS)
        if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
            raise psycopg.errors.error_from_result(result, encoding=raw.info.encoding)
    values = (result.get_value(row, 0) for row in range(result.ntuples))
    pid = result.get_value(0, 1) if result.ntuples else None
    schemas = [value.decode(raw.info.encoding) for value in values if value is not None]
    return schemas, None if pid is None else int(pid)



def pooled(using: str) -> bool:
    """Whether ``using`` is a pooled alias, whose server sessions the library must leave clean.

    The library keeps nothing in a session (docs/scaling.md), with one
    exception where it is safe: on an alias that is *not* pooled, the key's
    statements are prepared once per connection (:mod:`idempotency.store`).
    An alias is pooled when

    - its settings say so: ``DISABLE_SERVER_SIDE_CURSORS`` is True (what
      :func:`tenancy.databases` writes for ``pooled=...``, and what Django
      requires of an alias behind a transaction pooler); or
    - its connection shows it: the process id the connection was given at
      login (libpq's ``backend_pid``) is not its server process's
      (``pg_backend_pid()``). pgbouncer, like other poolers, answers the
      login itself, with an id of its own. Asked once per alias and process,
      with the probe of :func:`search_path_sql` (no round trip of its own).
    """
    connection = connections[using]
    if connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        return True
    search_path_sql(using)
    return _behind_pooler.get(_target(connection), True)


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


#: The binding, as tenancy_context_binding() computes it, read with names that
#: no search_path can redirect (injected SQL may set one for the session):
#: pg_catalog's functions, qualified (EXTRACT is always pg_catalog's), no operator.
_BINDING = (
    "SELECT pg_catalog.pg_backend_pid(), EXTRACT(epoch FROM pg_catalog.transaction_timestamp())"
)


def _binding(pid: Any, epoch: Any) -> str:
    # epoch is numeric with six decimals: exact in Decimal, as in the SQL function
    return f"{int(pid)}.{int(Decimal(str(epoch)) * 1_000_000)}"


def read_binding(connection: Any) -> str:
    """The current transaction's binding: what tenancy_context_binding() returns inside it.

    At the start of a transaction (Django's ``atomic()`` has turned autocommit
    off, and psycopg has not sent its ``BEGIN`` yet), psycopg's ``BEGIN`` and
    this query go out as one simple-protocol message, so the verified mode
    costs no round trip more than the plain one. psycopg reads the
    transaction's state from libpq, so it sends no second ``BEGIN``; the
    message goes to libpq directly, so Django's execute wrappers do not see it
    (tests/tenancy/test_verified.py pins this on the wire).
    """
    connection.ensure_connection()
    raw = connection.connection
    if (
        not connection.get_autocommit()
        and raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    ):
        begin = raw._get_tx_start_command()  # what psycopg would send, isolation level included
        with connection.wrap_database_errors, raw.lock:
            result = raw.pgconn.exec_(begin + b"; " + _BINDING.encode())
            if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                raise psycopg.errors.error_from_result(result, encoding=raw.info.encoding)
        pid, epoch = result.get_value(0, 0), result.get_value(0, 1)
        assert pid is not None and epoch is not None  # never NULL
        return _binding(pid.decode(), epoch.decode())
    with connection.cursor() as cursor:
        cursor.execute(_BINDING)
        row = cursor.fetchone()
    assert row is not None  # one row
    return _binding(*row)


def _set(connection: Any, tenant_id: int | None, *, fresh: bool = False) -> None:
    # The first context of a transaction pins its names too (search_path_sql),
    # in the same message: contexts inside it find the path pinned already.
    pin = [search_path_sql(connection.alias)] if fresh else []
    key = tenancy_settings.VERIFIED_CONTEXT
    if key is None:
        # On the cursor the library keeps per connection: a new one costs
        # more than this statement (tenancy.statements,
        # which imports this module, hence the import here).
        from tenancy.statements import cursor as kept_cursor

        _send(kept_cursor(connection.alias), [set_tenant_sql(tenant_id), *pin])
        return
    value = "" if tenant_id is None else str(validate_tenant_id(tenant_id))
    # The verified mode: the token, bound to this transaction, is what the
    # policies trust; app.tenant_id is still set, for code that reads it. The
    # token is digits, a key id ([A-Za-z0-9_-]) and hex: a safe literal.
    if fresh or connection not in _bindings:
        _bindings[connection] = read_binding(connection)
    token = "" if tenant_id is None else mint_token(key, tenant_id, _bindings[connection])
    with connection.cursor() as cursor:
        _send(cursor, [f"SET LOCAL {GUC} = '{value}'", f"SET LOCAL {TOKEN_GUC} = '{token}'", *pin])


def _send(cursor: Any, statements: list[str]) -> None:
    """Send ``statements`` (no parameters) in one message, where the cursor can.

    A cursor that binds on the server (``OPTIONS["server_side_binding"]``)
    sends one statement per message: psycopg may prepare what it sends
    (``prepare_threshold``), and a prepared statement holds one statement.
    """
    if isinstance(cursor.cursor, psycopg.ClientCursor):
        cursor.execute("; ".join(statements))
        return
    for statement in statements:
        cursor.execute(statement)


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
    with transaction.atomic(using=alias):
        stack = _stack(connection)
        if outermost:
            stack.clear()  # left over from a transaction that ended under us
        previous = stack[-1] if stack else None
        switch = previous != tenant_id
        if switch:
            # The first context of a transaction reads its binding afresh;
            # contexts inside it share that transaction, and the binding.
            _set(connection, tenant_id, fresh=not stack)
        stack.append(tenant_id)
        try:
            yield tenant_id
        except BaseException:
            # Our atomic block rolls back; the setting reverts with it.
            stack.pop()
            raise
        stack.pop()
        if switch and not outermost and not connection.needs_rollback:
            _set(connection, previous)


def current_tenant_id(using: str | None = None) -> int | None:
    """The tenant set by the innermost open :func:`tenant_context`, or None."""
    connection = connections[tenant_alias(using)]
    if not connection.in_atomic_block:
        return None
    stack = _stack(connection)
    return stack[-1] if stack else None
