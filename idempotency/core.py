"""The idempotency state machine, free of any web framework.

:func:`execute` runs a handler at most once per ``(tenant, scope, key)`` and
replays its answer afterwards. In the default single-transaction mode the
handler's writes, any outbox events and the stored answer commit together in
one transaction, so a crash anywhere leaves either everything or nothing.

How one request goes, each line one round trip::

    read      SET LOCAL the tenant; SELECT the key row: one message in
              autocommit, one implicit transaction (store.peek). A live
              row is answered from here: a replay is this one indexed read,
              with no BEGIN and no COMMIT.
    claim     BEGIN; SET LOCAL the tenant; SELECT the key row again and, if
              there is no live row, try a transaction-level advisory lock on
              the key (never blocks)
    handler   SAVEPOINT (opened after the lock: a rollback to the savepoint
              would otherwise release it), then the handler's own statements
    store     RELEASE SAVEPOINT; INSERT the finished row (UPDATE, to take
              over an expired one); COMMIT

A new key costs two round trips more than the handler's own transaction would
(the read and the claim; the store carries the COMMIT). ``BEGIN``, ``SET
LOCAL``, ``SAVEPOINT`` and ``RELEASE SAVEPOINT`` are held by the database
backend and travel with the next statement (:mod:`tenancy.backends.postgresql`);
on another backend each is a round trip of its own. Inside a caller's
transaction nothing is held: the claim's lookup answers a replay there.

- A live finished row is replayed (same fingerprint) or refused as a mismatch.
- No live row and the lock is taken by another transaction: that request is
  still running, so the answer is "in progress" (or, with a wait, the lookup
  is repeated until the first request has finished).
- The handler's answer decides what is stored: 2xx/3xx as ``completed``, a
  final 4xx as ``failed`` (its writes are rolled back to the savepoint, the
  answer is kept, and so is the key's lock, until the answer is committed),
  and a 5xx or a status in ``UNSTORED_STATUS_CODES`` not at all (everything
  is rolled back; a retry runs again). An exception rolls everything back and
  propagates.
- The unique primary key is the final arbiter: if the store finds a row that
  the lookup did not see, the whole transaction is rolled back and the request
  is answered from that row.

Every time comparison is made by the database clock (``now()``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from django.db import connections, transaction

from django_idempotency_outbox import tracing
from django_idempotency_outbox.durations import backoff
from idempotency import store
from idempotency.conf import MAX_KEY_LENGTH, idempotency_settings
from idempotency.exceptions import InvalidKey as InvalidKey  # public here too: core.InvalidKey
from idempotency.store import IdempotentRequest as IdempotentRequest  # public here too
from idempotency.store import StoredResponse as StoredResponse  # public here too
from tenancy import tenant_context
from tenancy.aliases import app_alias
from tenancy.context import holding

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


def _attempt(
    request: IdempotentRequest,
    handler: Callable[[], T],
    to_response: Callable[[T], StoredResponse],
    alias: str,
    ttl: timedelta,
) -> Result[T]:
    connection = connections[alias]
    verdict = Verdict.UNSTORED
    # In a transaction of our own, what returns nothing (BEGIN, the tenant's
    # SET LOCAL, the savepoint and its release) travels with our statements
    # and the COMMIT with the store; in the caller's transaction, nothing does.
    outermost = not connection.in_atomic_block and connection.get_autocommit()
    if outermost:
        # A finished key (a replay or a mismatch) is answered from one read
        # in autocommit: no transaction to begin and commit.
        peeked = store.peek(alias, request)
        if peeked is not None and peeked.live:
            return answer_from_row(request, peeked)
    with holding(alias, outermost), tenant_context(request.tenant_id, using=alias):
        with tracing.span("idempotency.key_lookup"):
            found = store.lookup(alias, request, lock=True)
        if found.live:
            return answer_from_row(request, found)
        if not found.locked:
            return Result(Outcome.IN_PROGRESS)
        try:
            # The handler's savepoint, opened after the key's lock: rolling
            # back to it (a final 4xx) undoes the handler's writes but keeps
            # the lock until the answer is stored and committed, so that a
            # duplicate cannot run the handler in between. (A lock taken
            # inside a savepoint is released by ROLLBACK TO SAVEPOINT.)
            with transaction.atomic(using=alias):
                with holding(alias, False):  # the handler's statements go as they come
                    value = handler()
                    response = to_response(value)
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
