"""Every statement on ``idempotency_keys``, and the rows they return.

The state machines (:mod:`idempotency.core`, :mod:`idempotency.phases`) and
the upkeep jobs (:mod:`idempotency.reaper`, :mod:`idempotency.completer`) ask
this module; none of them writes SQL or reads a row by position. Renaming a
column means editing the model, a new migration and this file.

Statements on the request path are hand-written, each for a reason named
beside it (one round trip per request, an advisory lock in the same
statement, a compare-and-set on the fencing token, the database clock of
``now()``/``clock_timestamp()``); the upkeep that gains nothing from SQL of
its own uses the ORM. The columns a request writes are listed once, in
:data:`_REQUEST` and :data:`_ANSWER`: the statements that store, claim or
finish a key are built from them.

Functions of the request path run on the caller's connection and inside its
``tenant_context``: row-level security confines them to the request's tenant.
The upkeep functions take the system alias (``using``) and see every tenant.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import BooleanField, Count, ExpressionWrapper, Q, Window
from django.db.models.functions import Coalesce, Now

from django_idempotency_outbox.leases import LeaseRow
from idempotency.models import IdempotencyKey
from tenancy import statements
from tenancy.conf import tenancy_settings
from tenancy.context import search_path_sql, set_tenant_sql
from tenancy.statements import Statement

if TYPE_CHECKING:
    from idempotency.core import IdempotentRequest, StoredResponse

PENDING = IdempotencyKey.State.PENDING.value

# --- rows -------------------------------------------------------------------
# A row type's fields are, in order, the columns its statement selects, under
# the same names (tests/idempotency/test_store.py holds them to it).


@dataclass(frozen=True, slots=True)
class KeyLookup:
    """What a lookup found for a key: no row, an expired row, or a live one.

    Attributes:
        live: None when there is no row; True for a row that is not to be
            treated as new (finished and not expired, or pending: pending
            rows never expire); False for an expired finished row.
        locked: only from ``lookup(..., lock=True)`` when no live row was
            found: whether this transaction took the key's advisory lock.
        leased: a run owns the key (phases mode: its lease has not run out).
        lease_token: the fencing token of the row's current owner.
        fingerprint, state, status_code, response, response_headers: the
            row's, None when there is no row.
    """

    live: bool | None
    locked: bool | None
    leased: bool
    lease_token: int | None
    fingerprint: str | None
    state: str | None
    status_code: int | None
    response: bytes | None
    response_headers: list[list[str]] | None

    @property
    def exists(self) -> bool:
        return self.live is not None


@dataclass(frozen=True, slots=True)
class Claim:
    """A phases-mode key as its new owner holds it."""

    token: int  # the fencing token of this run
    recovery_point: str
    phase_state: dict[str, Any]
    request_id: str


@dataclass(frozen=True, slots=True)
class StuckRow:
    """A pending key that nothing works on (see :func:`stuck_keys`)."""

    tenant_id: int
    scope: str
    key: str
    created_at: datetime
    recovery_point: str
    expired: bool


@dataclass(frozen=True, slots=True)
class GivenUp:
    """A pending key the reaper gave up on (see :func:`give_up_untouched`)."""

    tenant_id: int
    scope: str
    key: str
    recovery_point: str


@dataclass(frozen=True, slots=True)
class AbandonedKey:
    """A pending key whose client gave up (see :func:`abandoned_keys`)."""

    tenant_id: int
    scope: str
    key: str
    fingerprint: str
    method: str
    path: str
    request_data: dict[str, Any]


# --- the columns a request writes ---------------------------------------------

#: Who asked what: written when a key is first stored or claimed.
_REQUEST = {
    "request_hash": "%(fingerprint)s",
    "request_method": "%(method)s",
    "request_path": "%(path)s",
}

#: A final answer, by the database clock.
_ANSWER = {
    "state": "%(state)s",
    "status_code": "%(status_code)s",
    "response": "%(response)s",
    "response_headers": "%(response_headers)s::jsonb",
    "completed_at": "clock_timestamp()",
    "expires_at": "now() + %(ttl)s",
}

#: No answer yet (phases mode); the TTL runs from the claim.
_NO_ANSWER = {
    **dict.fromkeys(_ANSWER, "NULL"),
    "state": f"'{PENDING}'",
    "expires_at": _ANSWER["expires_at"],
}

_FINISHED = {**_REQUEST, **_ANSWER, "created_at": "now()"}

_CLAIMED = {
    **_REQUEST,
    **_NO_ANSWER,
    "recovery_point": "%(recovery_point)s",
    "phase_state": "'{}'",
    "request_data": "%(request_data)s::jsonb",
    "request_id": "gen_random_uuid()",
    "locked_until": "clock_timestamp() + %(lease)s",
    "created_at": "now()",
    "updated_at": "now()",
}

_PHASES_FINISHED = {
    **_ANSWER,
    "recovery_point": "'finished'",
    "phase_state": "%(phase_state)s::jsonb",
    "locked_until": "NULL",
    "updated_at": "now()",
}


#: A pending key given up on: the "abandoned" answer; the recovery point stays,
#: to show where it stopped.
_GIVEN_UP = {**_ANSWER, "locked_until": "NULL", "updated_at": "now()"}


def _names(values: Mapping[str, str], prefix: str = "") -> str:
    return ", ".join(prefix + name for name in values)


def _exprs(values: Mapping[str, str]) -> str:
    return ", ".join(values.values())


_KEY = "tenant_id = %(tenant_id)s AND scope = %(scope)s AND key = %(key)s"


def _key(request: IdempotentRequest, **values: Any) -> dict[str, Any]:
    return {"tenant_id": request.tenant_id, "scope": request.scope, "key": request.key, **values}


def _request(request: IdempotentRequest, **values: Any) -> dict[str, Any]:
    return _key(
        request,
        fingerprint=request.fingerprint,
        method=request.method[:10],
        path=request.path,
        **values,
    )


def _answer(response: StoredResponse, state: str, ttl: timedelta) -> dict[str, Any]:
    return {
        "state": state,
        "status_code": response.status_code,
        "response": response.body,
        "response_headers": json.dumps([list(h) for h in response.headers]),
        "ttl": ttl,
    }


def _json(value: Any) -> Any:
    # Django leaves jsonb undecoded on raw cursors (its JSONField decodes).
    return json.loads(value) if isinstance(value, str | bytes) else value


def _dumps(value: Any) -> str:
    return json.dumps(value, cls=DjangoJSONEncoder)


# --- the request path ----------------------------------------------------------

# One statement per lookup (a single round trip per request): the row if any,
# and, only when there is no live row, a try of the key's transaction-level
# advisory lock in the same statement (it never blocks). The join on one row
# answers "no row" too.
_LOOKUP = """
SELECT {live} AS live,
       {locked} AS locked,
       coalesce(k.locked_until > clock_timestamp(), false) AS leased,
       k.lease_token, k.request_hash AS fingerprint, k.state, k.status_code, k.response,
       k.response_headers
  FROM (SELECT 1) AS one
  LEFT JOIN idempotency_keys AS k
    ON k.tenant_id = %(tenant_id)s AND k.scope = %(scope)s AND k.key = %(key)s
"""
_LIVE = f"(k.expires_at > now() OR k.state = '{PENDING}')"
_LOOKUP_AND_LOCK = _LOOKUP.format(
    live=_LIVE,
    locked=f"CASE WHEN {_LIVE} THEN NULL ELSE pg_try_advisory_xact_lock(%(lock_id)s) END",
)
_LOOKUP_ONLY = _LOOKUP.format(live=_LIVE, locked="NULL::boolean")


def lookup(using: str, request: IdempotentRequest, *, lock: bool = False) -> KeyLookup:
    """The key's row as the request's transaction sees it.

    With ``lock``, a key without a live row is also locked for this
    transaction (``locked`` says whether the lock was free), in the same
    statement.
    """
    if lock:
        statement, params = _CLAIM_STATEMENT, _key(request, lock_id=request.lock_id)
    else:
        statement, params = _PEEK_STATEMENT, _key(request)
    cursor = statements.cursor(using)
    try:
        cursor.execute(_sql(cursor, statement), params)
    except DatabaseError as exc:
        statements.forget_if_gone(cursor, exc)
        raise
    live, locked, leased, token, fingerprint, state, status, body, headers = cursor.fetchone()
    return KeyLookup(live, locked, leased, token, fingerprint, state, status, body, _json(headers))


def peek(using: str, request: IdempotentRequest) -> KeyLookup | None:
    """The key's row, read in autocommit in one round trip; None if this connection cannot.

    The tenant's ``SET LOCAL``, the pinned search_path's
    (:func:`tenancy.context.search_path_sql`: the key is read from the
    library's table, never from a temporary table of the same name) and the
    lookup go in one message, which PostgreSQL runs as one implicit
    transaction: row-level security applies (the tenant is set for that
    transaction only), nothing is locked, and nothing is left set afterwards.
    A replay needs nothing more: no BEGIN, no COMMIT. Only outside a
    transaction (in one, the ``SET LOCAL`` would outlive the lookup) and on a
    cursor that binds on the client (the only kind that sends several
    statements in one message); otherwise None, and
    the caller looks the key up in its transaction. None too in the verified
    tenant context: its token is bound to a transaction's start, which a
    message cannot know before it runs.

    The first read of a connection that may keep prepared statements (an
    alias that is not pooled, :func:`tenancy.context.pooled`) prepares the
    request path's statements in the same message (:data:`_PREPARED`).
    """
    connection = connections[using]
    if connection.in_atomic_block or not connection.get_autocommit():
        return None
    if tenancy_settings.VERIFIED_CONTEXT is not None:
        return None
    cursor = statements.cursor(using)
    if not isinstance(cursor.cursor, psycopg.ClientCursor):
        return None
    pin = search_path_sql(using).replace("%", "%%")
    while True:  # once more after finding the prepared statements gone
        prepare = ""
        if statements.state(cursor, _PEEK_STATEMENT) is None and statements.may_prepare(
            cursor, using
        ):
            # After the pin, so that they are analysed with the library's
            # tables (PostgreSQL analyses a prepared statement again should the
            # search_path it runs under ever differ).
            prepare = "".join(f"{statement.prepare}; " for statement in _PREPARED)
        lookup = _PEEK_STATEMENT.call if prepare else _sql(cursor, _PEEK_STATEMENT)
        try:
            cursor.execute(f"{set_tenant_sql(request.tenant_id)}; {pin}; {prepare}{lookup}",
                           _key(request))
        except DatabaseError as exc:
            if prepare:
                statements.record(cursor, _PREPARED, prepared=False)  # unknown: text from now on
            elif statements.forget_if_gone(cursor, exc):
                continue
            raise
        if prepare:
            statements.record(cursor, _PREPARED, prepared=True)
        statements.select_result(cursor.cursor, -1)  # past the SET LOCALs and PREPAREs
        break
    live, locked, leased, token, fingerprint, state, status, body, headers = cursor.fetchone()
    return KeyLookup(live, locked, leased, token, fingerprint, state, status, body, _json(headers))


# The usual case: no row for this key. A plain INSERT (no ON CONFLICT: it is
# cheaper); the primary key still refuses a second row.
_INSERT = f"""
INSERT INTO idempotency_keys (tenant_id, scope, key, {_names(_FINISHED)})
VALUES (%(tenant_id)s, %(scope)s, %(key)s, {_exprs(_FINISHED)})
"""

# Taking over an expired, unreaped row, expired by the database clock. A pending
# row (phases mode) never expires into "new": its work may be half done.
_REPLACE_EXPIRED = f"""
UPDATE idempotency_keys SET ({_names(_FINISHED)}) = ROW({_exprs(_FINISHED)})
 WHERE {_KEY} AND expires_at <= now() AND state <> '{PENDING}'
"""


# --- prepared statements ---------------------------------------------------------
#
# Sent as text, each of the three statements above is parsed and planned by the
# server every time: for the read (its join, the row-level security policy)
# that is most of its cost, about 90 µs of server CPU against 40 prepared
# (docs/benchmarks.md). On an alias that is not pooled they are
# prepared, all three by a connection's first read (peek), in the same
# message, and sent as EXECUTE from then on (tenancy.statements).
# Through a pooler nothing is ever prepared: the next borrower of a server
# session would find names it did not prepare (tests/idempotency/test_prepared.py).

#: The parameters' types, for PREPARE.
_PARAM_TYPES = {
    "tenant_id": "bigint", "scope": "text", "key": "text", "lock_id": "bigint",
    "fingerprint": "text", "method": "text", "path": "text", "state": "text",
    "status_code": "integer", "response": "bytea", "response_headers": "text",
    "ttl": "interval",
}

_PEEK_STATEMENT = Statement.of("idempotency_peek", _LOOKUP_ONLY, _PARAM_TYPES)
_CLAIM_STATEMENT = Statement.of("idempotency_claim", _LOOKUP_AND_LOCK, _PARAM_TYPES)
_STORE_STATEMENT = Statement.of("idempotency_store", _INSERT, _PARAM_TYPES)
_PREPARED = (_PEEK_STATEMENT, _CLAIM_STATEMENT, _STORE_STATEMENT)


def _sql(cursor: Any, statement: Statement) -> str:
    """``statement`` as this cursor's session takes it: EXECUTE once prepared, else its text."""
    return statement.call if statements.state(cursor, statement) else statement.sql


def insert_finished(
    using: str,
    request: IdempotentRequest,
    response: StoredResponse,
    state: str,
    ttl: timedelta,
    *,
    commit: bool,
) -> bool:
    """Store a finished request under a key that had no row.

    With ``commit`` (a transaction of the caller's own, on a client-side
    binding cursor), ``COMMIT`` travels in the same message: psycopg's
    ``commit()`` is a no-op once the server reports the transaction finished,
    so Django's own commit that follows (and its ``on_commit`` callbacks)
    behave as usual. If the INSERT fails, the COMMIT after it is not run.

    Returns:
        False when another transaction stored this key first (the primary
        key refused ours); the caller's transaction must then roll back.
    """
    cursor = statements.cursor(using)
    merge = commit and isinstance(cursor.cursor, psycopg.ClientCursor)
    sql = _sql(cursor, _STORE_STATEMENT)
    try:
        cursor.execute(
            f"{sql}; COMMIT" if merge else sql,
            _request(request, **_answer(response, state, ttl)),
        )
    except IntegrityError as exc:
        # Only the primary key means a lost race. Anything else (a deferred
        # constraint of the handler's, checked at the merged COMMIT) is the
        # handler's error.
        if _is_key_conflict(exc):
            return False
        raise
    except DatabaseError as exc:
        statements.forget_if_gone(cursor, exc)
        raise
    return True


def _is_key_conflict(exc: IntegrityError) -> bool:
    cause = exc.__cause__
    return (
        isinstance(cause, psycopg.errors.UniqueViolation)
        and cause.diag.constraint_name == "idempotency_keys_pkey"
    )


def replace_expired(
    using: str,
    request: IdempotentRequest,
    response: StoredResponse,
    state: str,
    ttl: timedelta,
) -> bool:
    """Store a finished request over an expired finished row; False if it is gone."""
    with connections[using].cursor() as cursor:
        cursor.execute(_REPLACE_EXPIRED, _request(request, **_answer(response, state, ttl)))
        return int(cursor.rowcount) == 1


# --- phases mode -----------------------------------------------------------------

_CLAIM_RETURNING = (
    "RETURNING lease_token AS token, recovery_point, phase_state, request_id::text AS request_id"
)

# A new key, or an expired finished one taken over, in one statement (ON
# CONFLICT): the claim must not lose a race to a duplicate.
_CLAIM = f"""
INSERT INTO idempotency_keys AS k (tenant_id, scope, key, lease_token, {_names(_CLAIMED)})
VALUES (%(tenant_id)s, %(scope)s, %(key)s, 1, {_exprs(_CLAIMED)})
ON CONFLICT (tenant_id, scope, key) DO UPDATE
   SET lease_token = k.lease_token + 1,
       ({_names(_CLAIMED)}) = ROW({_names(_CLAIMED, "excluded.")})
 WHERE k.state <> '{PENDING}' AND k.expires_at <= now()
{_CLAIM_RETURNING}
"""

# Compare-and-set on the fencing token, against the lease by clock_timestamp().
_TAKE_OVER = f"""
UPDATE idempotency_keys
   SET lease_token = lease_token + 1, locked_until = clock_timestamp() + %(lease)s,
       updated_at = now()
 WHERE {_KEY} AND state = '{PENDING}' AND lease_token = %(token)s
   AND (locked_until IS NULL OR locked_until <= clock_timestamp())
{_CLAIM_RETURNING}
"""

# Compare-and-set on the fencing token; the lease is renewed by clock_timestamp().
_ADVANCE = f"""
UPDATE idempotency_keys
   SET recovery_point = %(recovery_point)s, phase_state = %(phase_state)s::jsonb,
       locked_until = clock_timestamp() + %(lease)s, updated_at = now()
 WHERE {_KEY} AND state = '{PENDING}' AND lease_token = %(token)s
"""

# Compare-and-set on the fencing token.
_FINISH = f"""
UPDATE idempotency_keys SET ({_names(_PHASES_FINISHED)}) = ROW({_exprs(_PHASES_FINISHED)})
 WHERE {_KEY} AND state = '{PENDING}' AND lease_token = %(token)s
"""

# Compare-and-set on the fencing token, in the DELETE itself: QuerySet.delete()
# would select first and delete by primary key where delete signals have receivers.
_FORGET = f"""
DELETE FROM idempotency_keys
 WHERE {_KEY} AND state = '{PENDING}' AND lease_token = %(token)s
   AND recovery_point = %(recovery_point)s
"""


def _fetch_claim(cursor: Any) -> Claim | None:
    row = cursor.fetchone()
    if row is None:
        return None
    token, recovery_point, phase_state, request_id = row
    return Claim(token, recovery_point, _json(phase_state) or {}, request_id)


def claim(
    using: str,
    request: IdempotentRequest,
    *,
    recovery_point: str,
    request_data: Any,
    lease: timedelta,
    ttl: timedelta,
) -> Claim | None:
    """Insert the key ``pending`` with a lease (or take over an expired finished row).

    Returns:
        The claim (fencing token 1, or one more than the replaced row's), or
        None when another request holds the key.
    """
    params = _request(
        request, recovery_point=recovery_point, request_data=_dumps(request_data),
        lease=lease, ttl=ttl,
    )
    with connections[using].cursor() as cursor:
        cursor.execute(_CLAIM, params)
        return _fetch_claim(cursor)


def take_over(using: str, request: IdempotentRequest, token: int, lease: timedelta) -> Claim | None:
    """Take a pending key whose lease ran out from the owner with ``token``; None if lost."""
    with connections[using].cursor() as cursor:
        cursor.execute(_TAKE_OVER, _key(request, token=token, lease=lease))
        return _fetch_claim(cursor)


def advance(
    using: str,
    request: IdempotentRequest,
    token: int,
    *,
    recovery_point: str,
    phase_state: dict[str, Any],
    lease: timedelta,
) -> bool:
    """Move the key to ``recovery_point`` and renew the lease; False if the lease was lost."""
    params = _key(
        request, token=token, recovery_point=recovery_point, phase_state=_dumps(phase_state),
        lease=lease,
    )
    with connections[using].cursor() as cursor:
        cursor.execute(_ADVANCE, params)
        return int(cursor.rowcount) == 1


def finish(
    using: str,
    request: IdempotentRequest,
    token: int,
    *,
    response: StoredResponse,
    state: str,
    phase_state: dict[str, Any],
    ttl: timedelta,
) -> bool:
    """Store the final answer of a phases request; False if the lease was lost."""
    params = _key(
        request, token=token, phase_state=_dumps(phase_state), **_answer(response, state, ttl)
    )
    with connections[using].cursor() as cursor:
        cursor.execute(_FINISH, params)
        return int(cursor.rowcount) == 1


def release(using: str, request: IdempotentRequest, token: int) -> None:
    """End the lease of the owner with ``token`` at once; a no-op if it was taken over."""
    _owned(using, request, token).update(locked_until=None, updated_at=Now())


def forget(using: str, request: IdempotentRequest, token: int, recovery_point: str) -> None:
    """Delete a pending key still at ``recovery_point`` and owned by ``token``."""
    with connections[using].cursor() as cursor:
        cursor.execute(_FORGET, _key(request, token=token, recovery_point=recovery_point))


def _owned(using: str, request: IdempotentRequest, token: int) -> Any:
    return IdempotencyKey.objects.using(using).filter(
        tenant_id=request.tenant_id, scope=request.scope, key=request.key,
        state=PENDING, lease_token=token,
    )


# --- upkeep, across tenants (the system alias) -------------------------------------

_UNATTENDED = f"state = '{PENDING}' AND (locked_until IS NULL OR locked_until <= clock_timestamp())"

# One more failed completer run of a pending key; the count comes back in the
# same round trip.
_COUNT_COMPLETER_FAILURE = f"""
UPDATE idempotency_keys SET completer_runs = completer_runs + 1
 WHERE {_KEY} AND state = '{PENDING}'
RETURNING completer_runs
"""

# Giving up on one pending key nobody holds (a run holding a lease decides itself).
_GIVE_UP = f"""
UPDATE idempotency_keys SET ({_names(_GIVEN_UP)}) = ROW({_exprs(_GIVEN_UP)})
 WHERE {_KEY} AND {_UNATTENDED}
RETURNING recovery_point
"""

# The reaper's batch: pending keys nobody has touched for a long time, chosen and
# locked in the UPDATE itself (SKIP LOCKED: a request that holds one is working
# on it), oldest first, by the database clock.
_GIVE_UP_UNTOUCHED = f"""
UPDATE idempotency_keys SET ({_names(_GIVEN_UP)}) = ROW({_exprs(_GIVEN_UP)})
 WHERE ctid = ANY(ARRAY(
       SELECT ctid FROM idempotency_keys
        WHERE {_UNATTENDED} AND coalesce(updated_at, created_at) < now() - %(after)s
        ORDER BY created_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED))
RETURNING tenant_id, scope, key, recovery_point
"""


def count_completer_failure(using: str, request: IdempotentRequest) -> int | None:
    """Count a failed completer run of a pending key; its count so far (None: not pending)."""
    with connections[using].cursor() as cursor:
        cursor.execute(_COUNT_COMPLETER_FAILURE, _key(request))
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def give_up(using: str, request: IdempotentRequest, response: StoredResponse,
            ttl: timedelta) -> str | None:
    """Finish a pending key nobody holds with ``response`` (state ``failed``).

    Returns:
        The recovery point it stopped at; None when it is no longer pending,
        or a run holds its lease.
    """
    params = _key(request, **_answer(response, IdempotencyKey.State.FAILED.value, ttl))
    with connections[using].cursor() as cursor:
        cursor.execute(_GIVE_UP, params)
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def give_up_untouched(using: str, after: timedelta, limit: int, response: StoredResponse,
                      ttl: timedelta) -> list[GivenUp]:
    """Finish up to ``limit`` pending keys untouched for ``after`` with ``response``.

    One transaction of its own; across tenants (the system alias).
    """
    params = {"after": after, "limit": limit,
              **_answer(response, IdempotencyKey.State.FAILED.value, ttl)}
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(_GIVE_UP_UNTOUCHED, params)
        return [GivenUp(*row) for row in cursor.fetchall()]


def count_untouched(using: str, after: timedelta) -> int:
    """How many keys :func:`give_up_untouched` would give up on."""
    return int(
        IdempotencyKey.objects.using(using)
        .filter(unattended())
        .alias(touched=Coalesce("updated_at", "created_at"))
        .filter(touched__lt=Now() - after)
        .count()
    )



def unattended() -> Q:
    """Pending keys that no run owns: no lease, or its lease has run out."""
    return Q(state=PENDING) & (Q(locked_until__isnull=True) | Q(locked_until__lte=Now()))


def stuck(after: timedelta) -> Q:
    """Unattended pending keys created more than ``after`` ago (the reaper and the admin)."""
    return unattended() & Q(created_at__lt=Now() - after)


def _expired(tenant_id: int) -> Q:
    return Q(tenant_id=tenant_id, expires_at__lte=Now()) & ~Q(state=PENDING)


#: The reaper's lease row in ``idempotency_leases`` (idempotency/sql/0006_leases.sql).
REAPER_LEASE = "reaper"

#: A lease of the library's single-instance jobs, a row of ``idempotency_leases``
#: (django_idempotency_outbox.leases): claimed and renewed by the same
#: compare-and-set, each in a transaction of its own (autocommit).
LEASES = LeaseRow("idempotency_leases", "name = %(name)s", owner="owner", until="until")


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a lease, and until when (the database clock)."""

    owner: str
    until: datetime | None


def claim_lease(using: str, name: str, owner: str, seconds: float) -> LeaseHolder | None:
    """Take or renew the lease ``name`` for ``seconds``; None when taken, else who holds it."""
    with connections[using].cursor() as cursor:
        cursor.execute(LEASES.claim, {"owner": owner, "seconds": seconds, "name": name})
        if cursor.fetchone() is not None:
            return None
        cursor.execute(LEASES.holder, {"name": name})
        row = cursor.fetchone()
    if row is None:
        raise RuntimeError(f"lease row {name!r} is missing from idempotency_leases: migrate")
    return LeaseHolder(row[0], row[1])


def release_lease(using: str, name: str, owner: str) -> None:
    """Give up ``owner``'s lease ``name`` (nothing if it is another's)."""
    with connections[using].cursor() as cursor:
        cursor.execute(LEASES.release, {"name": name, "owner": owner})


# The rows to delete are chosen and locked in the DELETE itself, skipping rows a
# live request holds (SKIP LOCKED), oldest first, by the database clock.
_DELETE_BATCH = f"""
DELETE FROM idempotency_keys
 WHERE ctid = ANY(ARRAY(
       SELECT ctid FROM idempotency_keys
        WHERE tenant_id = %s AND expires_at <= now() AND state <> '{PENDING}'
        ORDER BY expires_at
        LIMIT %s
        FOR UPDATE SKIP LOCKED))
"""


def delete_expired_batch(using: str, tenant_id: int, size: int) -> int:
    """Delete up to ``size`` expired finished keys of a tenant, in a transaction of its own."""
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        # A batch lost in a crash is simply deleted again by the next run,
        # so its commit need not wait for the WAL flush (nor make others wait).
        cursor.execute("SET LOCAL synchronous_commit = off")
        cursor.execute(_DELETE_BATCH, [tenant_id, size])
        return int(cursor.rowcount)


def count_expired(using: str, tenant_id: int) -> int:
    """How many keys of a tenant :func:`delete_expired_batch` would delete."""
    return IdempotencyKey.objects.using(using).filter(_expired(tenant_id)).count()


def stuck_keys(using: str, after: timedelta, limit: int) -> tuple[list[StuckRow], int]:
    """The oldest ``limit`` keys stuck unfinished, and how many there are, in one query."""
    rows = list(
        IdempotencyKey.objects.using(using)
        .filter(stuck(after))
        .annotate(
            expired=ExpressionWrapper(Q(expires_at__lte=Now()), output_field=BooleanField()),
            total=Window(Count("*")),
        )
        .order_by("created_at")
        .values_list("tenant_id", "scope", "key", "created_at", "recovery_point", "expired",
                     "total")[:limit]
    )
    return [StuckRow(*row[:-1]) for row in rows], (rows[0][-1] if rows else 0)


def abandoned_keys(
    using: str, scopes: list[str], older_than: timedelta, limit: int
) -> list[AbandonedKey]:
    """Unattended pending keys of ``scopes`` that nobody touched for ``older_than``."""
    rows = (
        IdempotencyKey.objects.using(using)
        .filter(unattended(), scope__in=scopes)
        .alias(touched=Coalesce("updated_at", "created_at"))
        .filter(touched__lt=Now() - older_than)
        .order_by("touched")
        .values_list("tenant_id", "scope", "key", "request_hash", "request_method",
                     "request_path", "request_data")[:limit]
    )
    return [AbandonedKey(*row[:-1], request_data=row[-1] or {}) for row in rows]


def pending_scopes(using: str) -> list[str]:
    """The scopes that have pending keys, across tenants (an alias that sees them all)."""
    rows = (
        IdempotencyKey.objects.using(using)
        .filter(state=PENDING)
        .order_by("scope")
        .values_list("scope", flat=True)
        .distinct()
    )
    return list(rows)
