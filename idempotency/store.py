"""Every statement on ``idempotency_keys``, and the rows they return.

The state machines (:mod:`idempotency.core`, :mod:`idempotency.phases`) and
the upkeep jobs (:mod:`idempotency.reaper`, :mod:`idempotency.completer`) ask
this module; none of them writes SQL or reads a row by position. The
statements are in ``idempotency/queries.sql``, each with the reason it is
hand-written (one round trip per request, an advisory lock in the same
statement, a compare-and-set on the fencing token, the database clock); the
request path's read and store call the PL/pgSQL functions of migration 0008,
whose plans PostgreSQL keeps per server session. Upkeep that gains nothing
from SQL of its own uses the ORM.

Functions of the request path run on the caller's connection and inside its
``tenant_context``: row-level security confines them to the request's tenant.
The upkeep functions take the system alias (``using``) and see every tenant.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connections, transaction
from django.db.models import BooleanField, Count, ExpressionWrapper, Q, Window
from django.db.models.functions import Coalesce, Now

from django_idempotency_outbox.sqlfiles import queries
from idempotency.models import IdempotencyKey
from tenancy.conf import tenancy_settings
from tenancy.context import holds_statements, prefix, set_tenant_sql
from tenancy.leases import Lease
from tenancy.statements import affected, fetch_all, fetch_one

#: The app's statements, by name (idempotency/queries.sql).
SQL = queries("idempotency")

PENDING = IdempotencyKey.State.PENDING.value

# --- what a request is, and what it is answered ---------------------------------


@dataclass(frozen=True)
class StoredResponse:
    """An answer as stored and replayed: status, body bytes, chosen headers."""

    status_code: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class IdempotentRequest:
    """What identifies a request and what it claims.

    Attributes:
        tenant_id: the tenant; also the row-level security context.
        scope: the operation, e.g. ``"order.create"``; keys are unique per scope.
        key: the client's idempotency key (already parsed).
        fingerprint: see :func:`idempotency.fingerprints.fingerprint`.
        method, path: recorded with the key for people reading it later.
        ttl: how long the finished answer is replayed.
    """

    tenant_id: int
    scope: str
    key: str
    fingerprint: str
    method: str = ""
    path: str = ""
    ttl: timedelta | None = None

    @property
    def lock_id(self) -> int:
        """A signed 64-bit advisory lock id for this key."""
        raw = f"{self.tenant_id}\x1f{self.scope}\x1f{self.key}".encode()
        return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big", signed=True)



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


# --- parameters -------------------------------------------------------------------


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


def _lookup(row: Any) -> KeyLookup:
    live, locked, leased, token, fingerprint, state, status, body, headers = row
    return KeyLookup(live, locked, leased, token, fingerprint, state, status, body, _json(headers))


# --- the request path ----------------------------------------------------------


def lookup(using: str, request: IdempotentRequest, *, lock: bool = False) -> KeyLookup:
    """The key's row as the request's transaction sees it.

    With ``lock``, a key without a live row is also locked for this
    transaction (``locked`` says whether the lock was free), in the same
    statement.
    """
    params = _key(request, lock_id=request.lock_id if lock else None)
    return _lookup(fetch_one(using, SQL["lookup"], params))


def peek(using: str, request: IdempotentRequest) -> KeyLookup | None:
    """The key's row, read in autocommit in one round trip; None if this connection cannot.

    The tenant's ``SET LOCAL`` and the lookup go in one message (with the
    pinned names, :func:`tenancy.statements.execute`), which PostgreSQL runs
    as one implicit transaction: row-level security applies (the tenant is
    set for that transaction only), nothing is locked, and nothing is left
    set afterwards. A replay needs nothing more: no BEGIN, no COMMIT. Only
    outside a transaction (in one, the ``SET LOCAL`` would outlive the
    lookup); otherwise None, and the caller looks the key up in its
    transaction. None too in the verified tenant context: its token is bound
    to a transaction's start, which a message cannot know before it runs.
    """
    connection = connections[using]
    if connection.in_atomic_block or not connection.get_autocommit():
        return None
    if tenancy_settings.VERIFIED_CONTEXT is not None or not holds_statements(using):
        return None
    prefix(using, set_tenant_sql(request.tenant_id))
    return _lookup(fetch_one(using, SQL["lookup"], _key(request, lock_id=None)))


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

    With ``commit`` (a transaction of the caller's own), ``COMMIT`` travels
    in the same message: psycopg's ``commit()`` sends nothing once the
    server reports the transaction finished, so Django's own commit that
    follows (and its ``on_commit`` callbacks) behave as usual. If the store
    fails, the COMMIT after it is not run.

    Returns:
        False when another transaction stored this key first (the primary
        key refused ours); the caller's transaction must then roll back.
    """
    sql = f"{SQL['store']}; COMMIT" if commit else SQL["store"]
    try:
        affected(using, sql, _request(request, **_answer(response, state, ttl)))
    except IntegrityError as exc:
        # Only the primary key means a lost race. Anything else (a deferred
        # constraint of the handler's, checked at the merged COMMIT) is the
        # handler's error.
        if _is_key_conflict(exc):
            return False
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
    params = _request(request, **_answer(response, state, ttl))
    return affected(using, SQL["replace_expired"], params) == 1


# --- phases mode -----------------------------------------------------------------


def _claimed(row: Any) -> Claim | None:
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
    return _claimed(fetch_one(using, SQL["claim"], params))


def take_over(using: str, request: IdempotentRequest, token: int, lease: timedelta) -> Claim | None:
    """Take a pending key whose lease ran out from the owner with ``token``; None if lost."""
    return _claimed(fetch_one(using, SQL["take_over"], _key(request, token=token, lease=lease)))


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
    return affected(using, SQL["advance"], params) == 1


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
    return affected(using, SQL["finish"], params) == 1


def release(using: str, request: IdempotentRequest, token: int) -> None:
    """End the lease of the owner with ``token`` at once; a no-op if it was taken over."""
    affected(using, SQL["release"], _key(request, token=token))


def forget(using: str, request: IdempotentRequest, token: int, recovery_point: str) -> None:
    """Delete a pending key still at ``recovery_point`` and owned by ``token``."""
    affected(using, SQL["forget"], _key(request, token=token, recovery_point=recovery_point))


# --- upkeep, across tenants (the system alias) -------------------------------------


def count_completer_failure(using: str, request: IdempotentRequest) -> int | None:
    """Count a failed completer run of a pending key; its count so far (None: not pending)."""
    row = fetch_one(using, SQL["count_completer_failure"], _key(request))
    return None if row is None else int(row[0])


def give_up(using: str, request: IdempotentRequest, response: StoredResponse,
            ttl: timedelta) -> str | None:
    """Finish a pending key nobody holds with ``response`` (state ``failed``).

    Returns:
        The recovery point it stopped at; None when it is no longer pending,
        or a run holds its lease.
    """
    params = _key(request, **_answer(response, IdempotencyKey.State.FAILED.value, ttl))
    row = fetch_one(using, SQL["give_up"], params)
    return None if row is None else str(row[0])


def give_up_untouched(using: str, after: timedelta, limit: int, response: StoredResponse,
                      ttl: timedelta) -> list[GivenUp]:
    """Finish up to ``limit`` pending keys untouched for ``after`` with ``response``.

    One transaction of its own; across tenants (the system alias).
    """
    params = {"after": after, "limit": limit,
              **_answer(response, IdempotencyKey.State.FAILED.value, ttl)}
    with transaction.atomic(using=using):
        return [GivenUp(*row) for row in fetch_all(using, SQL["give_up_untouched"], params)]


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


def reaper_lease(using: str) -> Lease:
    """The key reaper's lease, a row of ``idempotency_leases`` (migration 0006)."""
    return Lease("idempotency", "reaper", using)


def delete_expired_batch(using: str, tenant_id: int, size: int) -> int:
    """Delete up to ``size`` expired finished keys of a tenant, in a transaction of its own."""
    params = {"tenant_id": tenant_id, "limit": size}
    with transaction.atomic(using=using):
        prefix(using, SQL["commit_without_flush"])
        return affected(using, SQL["delete_expired_batch"], params)


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
