"""The idempotency state machine, free of any web framework.

:func:`execute` runs a handler at most once per ``(tenant, scope, key)`` and
replays its answer afterwards. In the default single-transaction mode the
handler's writes, any outbox events and the stored answer commit together in
one transaction, so a crash anywhere leaves either everything or nothing.

How one request goes, in a transaction of its own (each line one round trip)::

    read      SET LOCAL the tenant; SELECT the key row: one message in
              autocommit, one implicit transaction (store.peek). A live
              row is answered from here: a replay is this one indexed read,
              with no BEGIN and no COMMIT.
    claim     BEGIN; SET LOCAL the tenant; SELECT the key row again and, if
              there is no live row, try a transaction-level advisory lock on
              the key (never blocks); SAVEPOINT (after the lock, which a
              rollback to the savepoint would otherwise release)
    handler   runs inside the savepoint (its own statements)
    store     RELEASE SAVEPOINT; INSERT the finished row (UPDATE, to take
              over an expired one); COMMIT

A new key costs two round trips more than the handler's own transaction would
(the read and the claim; the store carries the COMMIT). ``BEGIN``, ``SET
LOCAL`` and ``SAVEPOINT`` travel with the claim, ``RELEASE SAVEPOINT`` and
``COMMIT`` with the store (see :class:`_Coalesce`, :class:`_HandlerSavepoint`
and :func:`idempotency.store.insert_finished`). Inside a caller's transaction
there is no read in autocommit and nothing is merged: the claim's lookup
answers a replay there.

- A live finished row is replayed (same fingerprint) or refused as a mismatch.
- No live row and the lock is taken by another transaction: that request is
  still running, so the answer is "in progress" (or, with a wait, the lookup
  is repeated until the first request has finished).
- The handler's answer decides what is stored: 2xx/3xx as ``completed``, a
  final 4xx as ``failed`` (its writes are rolled back to the savepoint, the
  answer is kept), and a 5xx or a status in ``UNSTORED_STATUS_CODES`` not at
  all (everything is rolled back; a retry runs again). An exception rolls
  everything back and propagates.
- The unique primary key is the final arbiter: if the store finds a row that
  the lookup did not see, the whole transaction is rolled back and the request
  is answered from that row.

Every time comparison is made by the database clock (``now()``).
"""

from __future__ import annotations

import _thread
import enum
import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

import psycopg
from django.db import connections, transaction

from django_idempotency_outbox import tracing
from django_idempotency_outbox.durations import backoff
from idempotency import store
from idempotency.conf import MAX_KEY_LENGTH, idempotency_settings
from idempotency.exceptions import InvalidKey as InvalidKey  # public here too: core.InvalidKey
from tenancy import tenant_context
from tenancy.aliases import app_alias
from tenancy.statements import cursor as kept_cursor
from tenancy.statements import select_result

T = TypeVar("T")


def parse_key(value: str) -> str:
    """Return the key carried by an ``Idempotency-Key`` header value.

    The value is one key: a Structured Field string (``"abc"``, RFC 8941,
    with ``\\"`` and ``\\\\`` escapes), as the IETF draft writes it, or the same
    key bare (``abc``), which the library also accepts; both name the same
    key. A key is 1 to ``MAX_KEY_LENGTH`` characters of printable ASCII; a
    bare key has no space, comma or quote in it.

    More than one value is refused, not joined: a repeated header reaches the
    application as one value with the two joined by a comma (``k1,k1``), as
    does a list (``"k1", "k2"``), and a proxy that duplicates or merges the
    header must not silently change the key.

    Raises:
        InvalidKey: with a message fit for the client.
    """
    limit = MAX_KEY_LENGTH
    value = value.strip(" \t")
    if value.startswith('"'):
        key = _parse_sf_string(value)
    else:
        key = value
        if "," in key:
            raise InvalidKey(_MANY_VALUES)
        if '"' in key:
            raise InvalidKey("The idempotency key has a stray quote.")
        if " " in key or "\t" in key:
            raise InvalidKey("A bare idempotency key has no spaces; quote it.")
    if not key:
        raise InvalidKey("The idempotency key is empty.")
    if not (key.isascii() and key.isprintable()):  # exactly 0x20-0x7E
        raise InvalidKey("The idempotency key must be printable ASCII.")
    if len(key) > limit:
        raise InvalidKey(f"The idempotency key is longer than {limit} characters.")
    return key


_MANY_VALUES = (
    "The Idempotency-Key header holds more than one value (a repeated header or a list); "
    "send exactly one key."
)


def _parse_sf_string(value: str) -> str:
    out: list[str] = []
    index = 1
    while index < len(value):
        ch = value[index]
        if ch == "\\":
            escaped = value[index + 1 : index + 2]
            if escaped not in ('"', "\\"):
                raise InvalidKey("The idempotency key has an invalid escape.")
            out.append(escaped)
            index += 2
        elif ch == '"':
            rest = value[index + 1 :].lstrip(" \t")
            if rest.startswith(","):
                raise InvalidKey(_MANY_VALUES)
            if rest:
                raise InvalidKey("The idempotency key has characters after its closing quote.")
            return "".join(out)
        else:
            out.append(ch)
            index += 1
    raise InvalidKey("The idempotency key has an unterminated quoted string.")


def key_pattern(max_length: int | None = None) -> str:
    """A regular expression matching exactly the header values :func:`parse_key` accepts.

    It reads the same in ECMA-262 (JSON Schema) and in Python.

    Used by the OpenAPI schema; a header value is matched without its
    surrounding whitespace.
    """
    n = MAX_KEY_LENGTH if max_length is None else max_length
    bare = r"[\x21\x23-\x2B\x2D-\x7E]"
    quoted = r'(?:[\x20\x21\x23-\x5B\x5D-\x7E]|\\[\x22\x5C])'
    return f'^(?:{bare}{{1,{n}}}|"{quoted}{{1,{n}}}")$'


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


class Outcome(enum.Enum):
    EXECUTED = "executed"  # the handler ran in this call
    REPLAYED = "replayed"  # a finished answer with the same fingerprint exists
    MISMATCH = "mismatch"  # the key was used for a different request
    IN_PROGRESS = "in_progress"  # the first request with this key is still running


class Verdict(enum.Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    UNSTORED = "unstored"


@dataclass(frozen=True)
class Result(Generic[T]):
    outcome: Outcome
    value: T | None = None  # the handler's return value, when EXECUTED
    stored: StoredResponse | None = None  # the answer to replay, when REPLAYED
    verdict: Verdict | None = None  # what was done with the handler's answer


def classify(status_code: int, unstored: Iterable[int] | None = None) -> Verdict:
    """Decide whether an answer is stored, and as what."""
    codes = idempotency_settings.UNSTORED_STATUS_CODES if unstored is None else unstored
    if status_code >= 500 or status_code in codes:
        return Verdict.UNSTORED
    if status_code >= 400:
        return Verdict.FAILED
    return Verdict.COMPLETED


class _Undo(Exception):
    """Rolls the handler's savepoint back while keeping its answer."""


class _LostRace(Exception):
    """Another transaction stored this key first; roll back and answer from its row."""


def execute(
    request: IdempotentRequest,
    handler: Callable[[], T],
    to_response: Callable[[T], StoredResponse],
    *,
    wait: float | None = None,
    using: str | None = None,
) -> Result[T]:
    """Run ``handler`` at most once for ``request``'s key, or answer from the key.

    Args:
        request: the key, its scope and tenant, and the request's fingerprint.
        handler: does the work; its database writes join the key's transaction.
            An exception it raises rolls everything back and propagates.
        to_response: turns the handler's return value into the answer to store.
        wait: seconds to wait for a duplicate in flight before answering
            ``IN_PROGRESS``; defaults to ``IN_PROGRESS_WAIT``.
        using: database alias (the app role); ``TENANCY["APP_DATABASE"]`` when omitted.

    Returns:
        A :class:`Result`; ``value`` is the handler's return value when it ran.
    """
    alias = app_alias(using)
    ttl = request.ttl or idempotency_settings.TTL

    def attempt() -> Result[T]:
        for _ in range(_MAX_LOST_RACES):
            try:
                return _attempt(request, handler, to_response, alias, ttl)
            except _LostRace:
                continue
        # Still not seeing the winner's row: an outer transaction's snapshot
        # (REPEATABLE READ) hides it. Answer as for a request in flight.
        return Result(Outcome.IN_PROGRESS)

    return retry_while_in_progress(attempt, wait)


#: Attempts after losing the race for a key before answering "in progress".
_MAX_LOST_RACES = 3

R = TypeVar("R")


def retry_while_in_progress(attempt: Callable[[], R], wait: float | None) -> R:
    """Call ``attempt`` until its result is not IN_PROGRESS or ``wait`` seconds passed.

    ``wait`` defaults to ``IN_PROGRESS_WAIT``; 0 calls it once. Pauses grow from
    10 ms to 200 ms.
    """
    wait = idempotency_settings.IN_PROGRESS_WAIT if wait is None else wait
    deadline = time.monotonic() + wait
    tries = 0
    while True:
        result = attempt()
        in_progress = getattr(result, "outcome", None) is Outcome.IN_PROGRESS
        if not in_progress or time.monotonic() >= deadline:
            return result
        tries += 1
        time.sleep(min(backoff(tries, 0.01, 0.2), max(0.0, deadline - time.monotonic())))


class _Coalesce:
    """Sends held-back utility statements with the next statement, in one round trip.

    ``SET LOCAL`` (from ``tenant_context``), ``SAVEPOINT`` and ``RELEASE
    SAVEPOINT`` (from ``transaction.atomic``) need no answer, yet each would
    cost a round trip of its own. While active, this execute wrapper holds
    them and prefixes them to the next statement. It is active only around the
    library's own statements, never while the handler runs, so the handler
    sees its tenant and savepoint in place before its first query. Where the
    cursor binds parameters on the server (no multi-statement queries), held
    statements are simply sent first, one by one.

    The statements are recognised by their text, which is Django's (and
    ``tenant_context``'s), not a documented API: tests/idempotency/test_upstream.py
    fails if it changes, or if one of them goes out as a round trip of its own.
    """

    HELD = ("SET LOCAL ", "SAVEPOINT ", "RELEASE SAVEPOINT ")

    def __init__(self, enabled: bool) -> None:
        # Only in a transaction of our own: there, the COMMIT ends everything,
        # so a statement still held at the end (a RELEASE) is not needed.
        # Nested in a caller's transaction, a held statement that was never
        # sent (the SET LOCAL restoring the outer tenant) would be lost.
        self.active = enabled
        self.held: list[str] = []
        #: Statements to send *after* the next statement, in its message (only
        #: on a cursor that binds on the client): the cursor is left on that
        #: statement's (last) result.
        self.trailing: list[str] = []
        #: Hold the next held statement as a trailing one (_HandlerSavepoint.trail).
        self.trail = False

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if self.active and params is None and not many and sql.startswith(self.HELD):
            (self.trailing if self.trail else self.held).append(sql)
            self.trail = False
            return None
        if not self.held and not self.trailing:
            return execute(sql, params, many, context)
        held, self.held = self.held, []
        trailing, self.trailing = self.trailing, []
        cursor = context["cursor"].cursor
        if many or not isinstance(cursor, psycopg.ClientCursor):
            # Never with trailing statements (_HandlerSavepoint.trail asks first).
            for statement in held:
                execute(statement, None, False, context)
            return execute(sql, params, many, context)
        # Bind first, then join: the joined text changes with every savepoint
        # name, and psycopg would parse it again for placeholders each time.
        bound = sql if params is None else cursor.mogrify(sql, params)
        raw = cursor.connection
        begin = begin_statement(raw)
        if begin is None:
            result = execute("; ".join([*held, bound, *trailing]), None, many, context)
        else:
            # psycopg would send its BEGIN as a round trip of its own before
            # this message; it goes first in the message instead. psycopg
            # sends a message as it is only in autocommit, so it is in
            # autocommit for this one execute (allowed: no transaction is
            # open yet); afterwards it is back to what it would be had it sent
            # BEGIN itself: not in autocommit, in the transaction. The public
            # setter refuses that inside a transaction, hence the attribute
            # (tests/idempotency/test_upstream.py pins it).
            raw.autocommit = True
            try:
                result = execute("; ".join([begin, *held, bound, *trailing]), None, many, context)
            finally:
                raw._autocommit = False
        # The caller reads its own statement's result (the last but the
        # trailing ones): selected at once, not by a nextset() per statement.
        select_result(cursor, -1 - len(trailing))
        return result


class _HandlerSavepoint(transaction.Atomic):
    """The handler's savepoint: Django's ``atomic()``, without its two new cursors.

    Opened *after* the claim's lookup and lock: rolling back to it (a final
    4xx, ``_Undo``) undoes the handler's writes but keeps the key's advisory
    lock, taken before it, until the answer is stored and committed, so that a
    duplicate cannot run the handler in between. (A lock taken inside a
    savepoint is released by ``ROLLBACK TO SAVEPOINT``.)

    ``atomic()`` sends ``SAVEPOINT`` and ``RELEASE SAVEPOINT`` each through a
    new cursor, only for :class:`_Coalesce` to hold them back: the cursor cost
    more than the statement. In a transaction of our own, on a cursor that
    binds on the client, :meth:`trail` sends ``SAVEPOINT`` on the cursor the
    library keeps (:func:`tenancy.statements.cursor`:
    execute wrappers and query logging see it as before), and ``coalesce``
    holds it to travel at the end of the claim's message; entering the block
    then keeps Django's books exactly as ``atomic()`` does (the savepoint's
    id in ``savepoint_ids``, the block in ``atomic_blocks``), and leaving it
    normally sends ``RELEASE SAVEPOINT`` the same way, held to travel at the
    head of the store's message. Leaving it by an exception (the handler's,
    or ``_Undo``) or with the transaction marked for rollback is
    ``atomic()``'s own exit: ``ROLLBACK TO SAVEPOINT`` (dropping the
    ``on_commit`` callbacks registered inside), then ``RELEASE``. Without
    :meth:`trail` (a caller's transaction, a cursor that binds on the server)
    it is ``atomic()`` unchanged, its ``SAVEPOINT`` sent as the block opens.
    """

    def __init__(self, using: str, coalesce: _Coalesce) -> None:
        super().__init__(using, savepoint=True, durable=False)
        self.alias = using
        self.coalesce = coalesce
        self.sid: str | None = None

    def trail(self) -> None:
        """Send ``SAVEPOINT`` after the next statement, in its message, where that can be.

        Call it just before the claim's lookup. If the block is not entered
        afterwards (a replay, a key in progress), the savepoint ends with the
        transaction: only a transaction of our own is ever given one here.
        """
        connection = connections[self.alias]
        if not (
            self.coalesce.active
            and connection.in_atomic_block
            and not connection.needs_rollback
            and not connection.get_autocommit()
            and issubclass(connection.connection.cursor_factory, psycopg.ClientCursor)
        ):
            return
        # connection.savepoint(), on the kept cursor: execute wrappers and
        # query logging see the statement, which coalesce holds as trailing.
        connection.savepoint_state += 1
        thread = str(_thread.get_ident()).replace("-", "")
        self.sid = f"s{thread}_x{connection.savepoint_state}"  # connection.savepoint()'s name
        self.coalesce.trail = True
        kept = kept_cursor(self.alias)
        kept.execute(connection.ops.savepoint_create_sql(self.sid))
        if self.coalesce.trail:
            # Not held: an execute wrapper outside coalesce changed its text (a
            # leading comment), and it went out at once, before the key's lock.
            # Released again at once; the block opens its savepoint as atomic()
            # does, after the lock.
            self.coalesce.trail = False
            kept.execute(connection.ops.savepoint_commit_sql(self.sid))
            self.sid = None

    def __enter__(self) -> None:
        if self.sid is None:
            super().__enter__()
            return
        connection = connections[self.alias]
        connection.savepoint_ids.append(self.sid)
        connection.atomic_blocks.append(self)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        connection = connections[self.alias]
        if (
            self.sid is None
            or exc_type is not None
            or connection.needs_rollback
            or connection.closed_in_transaction
        ):
            super().__exit__(exc_type, exc_value, traceback)
            return
        # connection.savepoint_commit(), on the kept cursor: coalesce holds
        # it, for the store that follows.
        connection.atomic_blocks.pop()
        sid = connection.savepoint_ids.pop()
        kept_cursor(self.alias).execute(connection.ops.savepoint_commit_sql(sid))


def begin_statement(raw: psycopg.Connection[Any]) -> str | None:
    """The BEGIN psycopg sends before its next statement, or None if it sends none.

    psycopg starts a transaction itself when it is not in autocommit and no
    transaction is open, with the connection's isolation level, read-only
    and deferrable modes: the same words as here.
    """
    if raw.autocommit or raw.info.transaction_status is not psycopg.pq.TransactionStatus.IDLE:
        return None
    parts = ["BEGIN"]
    if raw.isolation_level is not None:
        level = psycopg.IsolationLevel(raw.isolation_level)
        parts += ["ISOLATION LEVEL", level.name.replace("_", " ")]
    if raw.read_only is not None:
        parts.append("READ ONLY" if raw.read_only else "READ WRITE")
    if raw.deferrable is not None:
        parts.append("DEFERRABLE" if raw.deferrable else "NOT DEFERRABLE")
    return " ".join(parts)


def _attempt(
    request: IdempotentRequest,
    handler: Callable[[], T],
    to_response: Callable[[T], StoredResponse],
    alias: str,
    ttl: timedelta,
) -> Result[T]:
    connection = connections[alias]
    verdict = Verdict.UNSTORED
    # In a transaction of our own, utility statements and the COMMIT can travel
    # with our statements; inside the caller's transaction, nothing is merged.
    outermost = not connection.in_atomic_block and connection.get_autocommit()
    if outermost:
        # A finished key (a replay or a mismatch) is answered from one read
        # in autocommit: no transaction to begin and commit.
        peeked = store.peek(alias, request)
        if peeked is not None and peeked.live:
            return answer_from_row(request, peeked)
    coalesce = _Coalesce(enabled=outermost)
    with connection.execute_wrapper(coalesce), tenant_context(request.tenant_id, using=alias):
        # BEGIN and the tenant's SET LOCALs travel before the lookup, the
        # handler's SAVEPOINT after it (the key's lock outside the savepoint).
        savepoint = _HandlerSavepoint(alias, coalesce)
        savepoint.trail()
        with tracing.span("idempotency.key_lookup"):
            found = store.lookup(alias, request, lock=True)
        if found.live:
            return answer_from_row(request, found)
        if not found.locked:
            return Result(Outcome.IN_PROGRESS)
        try:
            with savepoint:
                coalesce.active = False
                try:
                    value = handler()
                    response = to_response(value)
                finally:
                    coalesce.active = outermost
                verdict = classify(response.status_code)
                if verdict is not Verdict.COMPLETED:
                    raise _Undo
        except _Undo:
            pass
        if verdict is Verdict.UNSTORED:
            return Result(Outcome.EXECUTED, value=value, verdict=verdict)
        with tracing.span("idempotency.store"):
            if found.exists:  # an expired row, not yet reaped
                stored = store.replace_expired(alias, request, response, verdict.value, ttl)
            else:
                stored = store.insert_finished(
                    alias, request, response, verdict.value, ttl, commit=outermost
                )
        if not stored:
            # Another transaction stored this key after our lookup (under
            # REPEATABLE READ, or in the instant between our snapshot and our
            # lock), or the reaper removed the expired row we meant to replace.
            raise _LostRace
    return Result(Outcome.EXECUTED, value=value, stored=response, verdict=verdict)


def answer_from_row(request: IdempotentRequest, row: store.KeyLookup) -> Result[Any]:
    """The answer a live key row gives ``request``: replay, mismatch or in progress."""
    if row.fingerprint != request.fingerprint:
        return Result(Outcome.MISMATCH)
    if row.state == "pending":
        return Result(Outcome.IN_PROGRESS)
    assert row.status_code is not None  # finished rows always have one (a check constraint)
    stored = StoredResponse(
        status_code=row.status_code,
        body=bytes(row.response or b""),
        headers=tuple((name, value) for name, value in (row.response_headers or [])),
    )
    return Result(Outcome.REPLAYED, stored=stored)
