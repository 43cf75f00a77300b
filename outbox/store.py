"""Every statement on the outbox's tables, and the rows they return.

``outbox_messages``, ``consumer_offsets``, ``outbox_dead_letters`` and
``outbox_received`` are read and written here and nowhere else; the other
modules of the app decide what to do and call these functions. Each function
takes the database alias it runs on as its first argument: the caller
decides, through :mod:`tenancy.aliases`, which role does what (the app role
under row-level security, the system role across tenants), and runs
tenant-scoped statements inside :func:`tenancy.tenant_context`. A function
runs in whatever transaction its caller has open on that alias.

Rows come back as the types below, or as :class:`~outbox.stream.Message`,
:class:`~outbox.stream.Envelope` and :class:`~outbox.stream.Batch`; never as
positional tuples.

The ORM is used where it costs nothing that could be measured; hand-written
SQL where it earns its place, with the reason beside it. The delivery fence
(what may be read) is defined once, in :data:`FENCE`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections
from django.db.models import Count, F
from django.db.models.functions import Now

from outbox.stream import ENVELOPE_KEYS, Batch, Envelope, Message

# The models are imported by the functions that use them: publish() and
# receive() import this module, and may be imported before Django's app
# registry is ready (e.g. at the top of an app's apps.py).

# -- rows ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetRow:
    """A consumer partition's offset row, locked by the caller's transaction.

    Attributes:
        position: ``(xid, id)`` of the last message passed.
        attempts: failed attempts at the message after ``position`` (0: none).
        waiting: that message's next attempt is not due yet.
        stale: not advanced for 5 seconds (or never), so moving it past a
            quiet stretch of the stream is worth a write.
    """

    position: tuple[int, int]
    attempts: int
    waiting: bool
    stale: bool


@dataclass(frozen=True, slots=True)
class HeadFailure:
    """Why an offset stopped before a message: kept on the offset row until it passes.

    Attributes:
        attempts: failed attempts so far.
        retry_in: seconds until the next attempt.
        error: the last traceback (the caller bounds its length).
    """

    attempts: int
    retry_in: float
    error: str


@dataclass(frozen=True, slots=True)
class ReaderPosition:
    """Where one reader (a consumer partition or a relay) is."""

    name: str
    partition: int
    position: tuple[int, int]


@dataclass(frozen=True)
class ReaderLag:
    """One reader (a consumer partition or a relay).

    Attributes:
        behind: messages below the fence that it has not passed yet (for a
            consumer with topics or partitions, an upper bound: rows of other
            topics and partitions count too).
        attempts, retry_at, last_error: the head message's failures, if any.
    """

    name: str
    partition: int
    partition_count: int
    position: tuple[int, int]
    behind: int
    last_processed_age: timedelta | None
    attempts: int
    last_error: str


@dataclass(frozen=True)
class Blocker:
    """An open transaction with a transaction id: it holds the fence at or below it."""

    pid: int | None
    xid: int
    age: timedelta | None
    state: str | None
    query: str | None
    database: str | None
    user: str | None


@dataclass(frozen=True)
class Parked:
    """A dead-letter row, as listed for people."""

    tenant_id: int
    id: int
    consumer: str
    message_id: str
    topic: str
    key: str | None
    attempts: int
    parked_at: datetime
    error: str


@dataclass(frozen=True, slots=True)
class ParkedMessage:
    """A dead-letter row locked for re-driving: the consumer and its message."""

    consumer: str
    message: Message


# -- JSON ---------------------------------------------------------------------


def _jsonb(value: Any) -> Any:
    """A jsonb value from a raw row, decoded (Django has psycopg return jsonb as text)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def _to_jsonb(value: Any) -> str:
    """JSON text for a ``%s::jsonb`` parameter (dates, decimals, UUIDs as Django encodes them).

    Raises:
        TypeError: ``value`` is not JSON-serialisable.
    """
    return json.dumps(value, cls=DjangoJSONEncoder)


# -- publishing ---------------------------------------------------------------

# Hand-written: one round trip on the caller's hot path; the id (identity)
# and xid (pg_current_xact_id()) come from column defaults the models do not know.
_INSERT_MESSAGE = """
INSERT INTO outbox_messages
       (tenant_id, message_id, topic, key, aggregate_type, aggregate_id, payload, headers)
VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb)
"""


def insert_message(
    using: str,
    *,
    tenant_id: int,
    message_id: uuid.UUID,
    topic: str,
    key: str | None,
    aggregate_type: str | None,
    aggregate_id: str | None,
    payload: Any,
    headers: dict[str, Any],
) -> None:
    """Write one message in the caller's transaction, as the current tenant.

    Raises:
        TypeError: the payload or headers are not JSON-serialisable (before
            anything is sent to the database).
    """
    params: list[Any] = [
        tenant_id, message_id, topic, key, aggregate_type, aggregate_id,
        _to_jsonb(payload), _to_jsonb(headers),
    ]
    with connections[using].cursor() as cursor:
        cursor.execute(_INSERT_MESSAGE, params)


# -- the stream ---------------------------------------------------------------

#: The delivery fence: every transaction with a smaller id has ended, so no
#: message below it can still appear. Server-wide for now: any open transaction
#: with an id holds it back (:func:`count_held_back` counts what waits,
#: :func:`find_blocker` names the transaction). The one definition: the reads,
#: ``outbox_status`` and :class:`~outbox.stream.Batch` all take it from here.
FENCE = "pg_snapshot_xmin(pg_current_snapshot())"

_MESSAGE_COLUMNS = (
    "m.id, m.message_id, m.tenant_id, m.topic, m.payload, m.key, m.aggregate_type,"
    " m.aggregate_id, m.headers, m.created_at, m.xid::text"
)

# The envelope as PostgreSQL writes it: the keys of Message.envelope()
# (ENVELOPE_KEYS, in order), each the column of that name but for these two.
# Hand-written (json_build_object) so that the relay passes payloads through
# as text, never decoding and re-encoding them.
_ENVELOPE_VALUES = {
    # Message.headers is {} for SQL NULL and JSON null alike.
    "headers": "coalesce(nullif(m.headers, 'null'::jsonb), '{}'::jsonb)",
    # UTC, as datetime.isoformat() writes it: no fraction when it is zero.
    "created_at": """to_char(m.created_at AT TIME ZONE 'UTC',
        CASE WHEN extract(microseconds FROM m.created_at)::bigint %% 1000000 = 0
             THEN 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"'
             ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"' END)""",
}
_ENVELOPE_JSON = "json_build_object({})::text".format(
    ", ".join(f"'{key}', {_ENVELOPE_VALUES.get(key, f'm.{key}')}" for key in ENVELOPE_KEYS)
)
_ENVELOPE_COLUMNS = "m.id, m.xid::text, m.message_id::text, m.topic, " + _ENVELOPE_JSON

#: The partition of a message: a hash of its key, or of its message id when it
#: has no key (such messages promise no order, so they may spread).
_PARTITION_OF = (
    "mod(hashtextextended(coalesce(m.key, m.message_id::text), 0) & 9223372036854775807, %s)"
)


def read_batch(
    using: str,
    after: tuple[int, int],
    limit: int,
    *,
    topics: Sequence[str] | None = None,
    partition: int = 0,
    partition_count: int = 1,
) -> Batch[Message]:
    """The next messages after ``after``, below the fence, in ``(xid, id)`` order.

    This is the read that makes offsets gap-safe. A reader remembers the
    ``(xid, id)`` of the last message it passed and asks for the next rows in
    ``(xid, id)`` order, but only rows whose transaction id is below the
    oldest transaction still running (:data:`FENCE`)::

        WHERE (xid, id) > (last_xid, last_id)
          AND xid < pg_snapshot_xmin(pg_current_snapshot())
        ORDER BY xid, id

    Below that fence every transaction has ended, so no row can still appear
    there; a row committed later has a transaction id at or above the fence
    and therefore sorts after everything read so far. Reading
    ``WHERE id > last_id`` instead loses a row whose transaction took its id
    first and committed last.

    The price: one long transaction anywhere on the server holds delivery
    back until it ends (``outbox_status`` names it).

    Run on the system alias (it sees every tenant) as a statement of its own,
    never inside a transaction of that alias: the fence and the rows come from
    the same snapshot, taken by this statement.

    Args:
        using: a database alias whose role is not subject to row-level security.
        after: the reader's position, ``(xid, id)`` of the last message passed.
        limit: at most this many messages.
        topics: only these topics (None: all).
        partition, partition_count: only messages whose key hashes to ``partition``.
    """
    fence, rows = _fenced_select(
        using, _MESSAGE_COLUMNS, after, limit, topics, partition, partition_count
    )
    messages = [_message(row) for row in rows]
    messages.sort(key=lambda m: m.position)
    return Batch(messages, fence)


def read_envelopes(using: str, after: tuple[int, int], limit: int) -> Batch[Envelope]:
    """As :func:`read_batch` (all topics, one partition), each message as an :class:`Envelope`.

    PostgreSQL writes each envelope's JSON, in the same statement and snapshot.
    """
    fence, rows = _fenced_select(using, _ENVELOPE_COLUMNS, after, limit, None, 0, 1)
    envelopes = [
        Envelope(id_, int(xid), message_id, topic, text)
        for id_, xid, message_id, topic, text in rows
    ]
    envelopes.sort(key=lambda e: e.position)
    return Batch(envelopes, fence)


def _message(row: Sequence[Any]) -> Message:
    (id_, message_id, tenant_id, topic, payload, key, aggregate_type, aggregate_id, headers,
     created_at, xid) = row
    return Message(
        id=id_,
        message_id=message_id if isinstance(message_id, uuid.UUID) else uuid.UUID(str(message_id)),
        tenant_id=tenant_id,
        topic=topic,
        payload=_jsonb(payload),
        key=key,
        aggregate_type=aggregate_type,
        aggregate_id=aggregate_id,
        headers=_jsonb(headers) or {},
        created_at=created_at,
        xid=int(xid),
    )


def _fenced_select(
    using: str,
    columns: str,
    after: tuple[int, int],
    limit: int,
    topics: Sequence[str] | None,
    partition: int,
    partition_count: int,
) -> tuple[int, list[Sequence[Any]]]:
    """The fence and the selected ``columns`` of the next rows (see :func:`read_batch`)."""
    where = ["(m.xid, m.id) > (%s::xid8, %s)", "m.xid < f.xmin"]
    params: list[Any] = [str(after[0]), after[1]]
    if topics is not None:
        where.append("m.topic = ANY(%s)")
        params.append(list(topics))
    if partition_count > 1:
        where.append(f"{_PARTITION_OF} = %s")
        params += [partition_count, partition]
    params.append(limit)
    # Hand-written: the fence and the rows from one snapshot (the lateral join
    # still returns the fence when no row matches), along the (xid, id) index.
    sql = f"""
        SELECT f.xmin::text, b.*
          FROM (SELECT {FENCE} AS xmin) AS f
          LEFT JOIN LATERAL (
                SELECT {columns}
                  FROM outbox_messages AS m
                 WHERE {" AND ".join(where)}
                 ORDER BY m.xid, m.id
                 LIMIT %s
          ) AS b ON TRUE
    """
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    fence = int(rows[0][0])
    return fence, [row[1:] for row in rows if row[1] is not None]


def current_fence(using: str) -> int:
    """The fence as a statement on ``using`` sees it now (see :data:`FENCE`)."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT {FENCE}::text")
        return int(cursor.fetchone()[0])


# -- consumer offsets ---------------------------------------------------------


def partition_counts(using: str, name: str) -> set[int]:
    """The partition counts of the offset rows named ``name`` (empty: none yet)."""
    from outbox.models import ConsumerOffset

    rows = ConsumerOffset.objects.using(using).filter(name=name)
    return set(rows.values_list("partition_count", flat=True).distinct())


# Hand-written: every partition in one statement, and the row count says how
# many were new (bulk_create(ignore_conflicts=True) cannot tell).
_CREATE_OFFSETS = """
INSERT INTO consumer_offsets (name, partition, partition_count)
SELECT %s, p, %s FROM generate_series(0, %s - 1) AS p
ON CONFLICT (name, partition) DO NOTHING
"""


def create_offsets(using: str, name: str, partitions: int) -> int:
    """Create the offset rows ``name`` 0..partitions-1 at the start of the outbox, if missing.

    Returns:
        How many rows were created.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(_CREATE_OFFSETS, [name, partitions, partitions])
        return cursor.rowcount


# Hand-written: SKIP LOCKED (another worker has the partition: move on), and
# the clock comparisons made by the database, on the consumer's hot path.
_LOCK_OFFSET = """
SELECT last_xid::text, last_id, attempts, coalesce(retry_at > now(), false),
       coalesce(last_processed_at < now() - interval '5 seconds', true)
  FROM consumer_offsets
 WHERE name = %s AND partition = %s
   FOR UPDATE SKIP LOCKED
"""


def lock_offset(using: str, name: str, partition: int) -> OffsetRow | None:
    """Lock a consumer partition's offset row until the caller's transaction ends.

    Returns:
        The row, or None when another worker holds it (or it does not exist).
    """
    with connections[using].cursor() as cursor:
        cursor.execute(_LOCK_OFFSET, [name, partition])
        row = cursor.fetchone()
    if row is None:
        return None
    last_xid, last_id, attempts, waiting, stale = row
    return OffsetRow((int(last_xid), last_id), attempts, waiting, stale)


# Hand-written: once per batch on the consumer's hot path; retry_at is taken
# from the database clock.
_ADVANCE_OFFSET = """
UPDATE consumer_offsets
   SET last_xid = %s::xid8, last_id = %s, last_processed_at = now(),
       attempts = %s, retry_at = now() + make_interval(secs => %s), last_error = %s
 WHERE name = %s AND partition = %s
"""


def advance_offset(
    using: str,
    name: str,
    partition: int,
    position: tuple[int, int],
    failure: HeadFailure | None = None,
) -> None:
    """Move a consumer partition to ``position``, recording (or clearing) its head's failure."""
    attempts, retry_in, error = (
        (0, None, "") if failure is None
        else (failure.attempts, failure.retry_in, failure.error)
    )
    with connections[using].cursor() as cursor:
        cursor.execute(
            _ADVANCE_OFFSET,
            [str(position[0]), position[1], attempts, retry_in, error, name, partition],
        )


def reader_positions(using: str) -> list[ReaderPosition]:
    """Every reader's position (all consumer partitions and relays)."""
    from outbox.models import ConsumerOffset

    rows = ConsumerOffset.objects.using(using).values_list(
        "name", "partition", "last_xid", "last_id"
    )
    return [ReaderPosition(name, partition, (int(xid), int(last_id)))
            for name, partition, xid, last_id in rows]


# -- the relay's lease --------------------------------------------------------

# Hand-written: a compare-and-set on the lease, taken from the database clock,
# returning the position in the same round trip.
_CLAIM_LEASE = """
UPDATE consumer_offsets
   SET lease_owner = %s, lease_until = now() + make_interval(secs => %s)
 WHERE name = %s AND partition = 0
   AND (lease_owner = %s OR lease_until IS NULL OR lease_until < now())
RETURNING last_xid::text, last_id
"""

# Hand-written: a compare-and-set on the old position and the lease owner.
_ADVANCE_LEASED = """
UPDATE consumer_offsets
   SET last_xid = %s::xid8, last_id = %s, last_processed_at = now()
 WHERE name = %s AND partition = 0
   AND last_xid = %s::xid8 AND last_id = %s AND lease_owner = %s
"""


def claim_lease(using: str, name: str, owner: str, seconds: float) -> tuple[int, int] | None:
    """Take or renew the lease on the offset row ``name`` for ``seconds``.

    Creates the row (at the start of the outbox) if it is missing. Each
    statement commits on its own (the caller has no transaction open).

    Returns:
        The row's position, or None while another owner's lease runs.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(_CLAIM_LEASE, [owner, seconds, name, owner])
        row = cursor.fetchone()
        if row is None:
            cursor.execute(_CREATE_OFFSETS, [name, 1, 1])
            if cursor.rowcount:
                cursor.execute(_CLAIM_LEASE, [owner, seconds, name, owner])
                row = cursor.fetchone()
    if row is None:
        return None
    last_xid, last_id = row
    return (int(last_xid), int(last_id))


def advance_leased(
    using: str, name: str, owner: str, expected: tuple[int, int], position: tuple[int, int]
) -> bool:
    """Move the offset row ``name`` from ``expected`` to ``position`` if ``owner`` holds its lease.

    Returns:
        False when the row was not at ``expected`` or the lease is another's.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(
            _ADVANCE_LEASED,
            [str(position[0]), position[1], name, str(expected[0]), expected[1], owner],
        )
        return cursor.rowcount == 1


def release_lease(using: str, name: str, owner: str) -> None:
    """Give up ``owner``'s lease on the offset row ``name`` (nothing if it is not ``owner``'s)."""
    from outbox.models import ConsumerOffset

    ConsumerOffset.objects.using(using).filter(
        name=name, partition=0, lease_owner=owner
    ).update(lease_until=None, lease_owner="")


# -- rewinding the relay ------------------------------------------------------
#
# After a broker lost messages the relay had already passed, the relay is set
# back to a position before them and sends everything from there again. These
# are the only statements that know what "the position just before a message"
# is: (xid, id - 1) in the (xid, id) delivery order. Nothing with the same xid
# and a smaller id sorts after it, so every message at or after the target,
# and only those, lie above it.


@dataclass(frozen=True, slots=True)
class StreamMark:
    """A message as a place to rewind a reader to.

    Attributes:
        before: the reader position just before the message: a reader set
            there reads the message next.
        message_id, created_at: the message's.
    """

    before: tuple[int, int]
    message_id: uuid.UUID
    created_at: datetime


_MARK_COLUMNS = "m.xid::text, m.id - 1, m.message_id, m.created_at"

# Hand-written, like every read of positions: the row comparison on xid8. There
# is no index on message_id: an operator's one-off lookup scans the outbox.
_MARK_OF_MESSAGE = f"SELECT {_MARK_COLUMNS} FROM outbox_messages AS m WHERE m.message_id = %s"

# The first message in delivery order published at or after a time: along the
# delivery index, filtered (created_at is each transaction's start time, which
# is not the delivery order, hence "first in order", not "first in time").
_FIRST_MARK_SINCE = f"""
SELECT {_MARK_COLUMNS} FROM outbox_messages AS m
 WHERE m.created_at >= %s ORDER BY m.xid, m.id LIMIT 1
"""

_OLDEST_MARK = f"SELECT {_MARK_COLUMNS} FROM outbox_messages AS m ORDER BY m.created_at LIMIT 1"

# Messages a reader moved from ``upto`` back to ``after`` reads again, per topic.
_COUNT_BETWEEN = """
SELECT m.topic, count(*) FROM outbox_messages AS m
 WHERE (m.xid, m.id) > (%s::xid8, %s) AND (m.xid, m.id) <= (%s::xid8, %s)
 GROUP BY m.topic ORDER BY m.topic
"""

# Only backwards (a forward move would skip messages), and the lease is dropped:
# a relay that holds it cannot advance over the new position (its
# compare-and-set on the old position and its lease fails); it claims the lease
# again and reads from here.
_SET_RELAY_POSITION = """
UPDATE consumer_offsets
   SET last_xid = %s::xid8, last_id = %s, last_processed_at = now(),
       lease_owner = '', lease_until = NULL
 WHERE name = %s AND partition = 0 AND (last_xid, last_id) > (%s::xid8, %s)
"""


def _mark(row: Sequence[Any] | None) -> StreamMark | None:
    if row is None:
        return None
    xid, before_id, message_id, created_at = row
    return StreamMark((int(xid), int(before_id)), message_id, created_at)


def mark_of_message(using: str, message_id: uuid.UUID) -> StreamMark | None:
    """The message ``message_id`` as a place to rewind to (None: not in the outbox)."""
    with connections[using].cursor() as cursor:
        cursor.execute(_MARK_OF_MESSAGE, [message_id])
        return _mark(cursor.fetchone())


def first_mark_since(using: str, since: datetime) -> StreamMark | None:
    """The first message in delivery order published at or after ``since`` (None: none).

    A reader set just before it reads every message published since then
    (and maybe some published a little earlier, which sort after it).
    """
    with connections[using].cursor() as cursor:
        cursor.execute(_FIRST_MARK_SINCE, [since])
        return _mark(cursor.fetchone())


def oldest_mark(using: str) -> StreamMark | None:
    """The oldest message still kept (None: the outbox is empty)."""
    with connections[using].cursor() as cursor:
        cursor.execute(_OLDEST_MARK)
        return _mark(cursor.fetchone())


def count_between(using: str, after: tuple[int, int], upto: tuple[int, int]) -> dict[str, int]:
    """Messages after ``after`` up to ``upto`` (included), per topic."""
    with connections[using].cursor() as cursor:
        cursor.execute(_COUNT_BETWEEN, [str(after[0]), after[1], str(upto[0]), upto[1]])
        return {topic: int(count) for topic, count in cursor.fetchall()}


def set_relay_position(using: str, name: str, position: tuple[int, int]) -> bool:
    """Move the relay offset row ``name`` back to ``position`` and drop its lease.

    Returns:
        False when the row does not exist or is not after ``position``.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(
            _SET_RELAY_POSITION,
            [str(position[0]), position[1], name, str(position[0]), position[1]],
        )
        return cursor.rowcount == 1


def database_now(using: str) -> datetime:
    """The database clock (every time comparison of the library uses it)."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT now()")
        now: datetime = cursor.fetchone()[0]
        return now


# -- dead letters -------------------------------------------------------------

# Hand-written: the row's id comes from an identity the model does not know
# (the ORM would insert NULL).
_PARK = """
INSERT INTO outbox_dead_letters
       (tenant_id, consumer, message_pk, message_id, topic, key, aggregate_type,
        aggregate_id, payload, headers, message_created_at, attempts, error)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, %s, %s, %s)
"""


def park(using: str, consumer: str, message: Message, attempts: int, error: str) -> None:
    """Copy ``message`` into the dead-letter table, as its tenant (the caller's context)."""
    params: list[Any] = [
        message.tenant_id, consumer, message.id, message.message_id, message.topic, message.key,
        message.aggregate_type, message.aggregate_id, _to_jsonb(message.payload),
        _to_jsonb(message.headers), message.created_at, attempts, error,
    ]
    with connections[using].cursor() as cursor:
        cursor.execute(_PARK, params)


def is_parked(using: str, consumer: str, message_id: uuid.UUID) -> bool:
    """Whether ``consumer`` has already parked ``message_id`` (of the tenants ``using`` sees)."""
    from outbox.models import DeadLetter

    return DeadLetter.objects.using(using).filter(
        consumer=consumer, message_id=message_id
    ).exists()


def list_parked(
    using: str, consumer: str | None = None, tenant_id: int | None = None, limit: int = 100
) -> list[Parked]:
    """Parked messages that ``using`` may see, oldest first."""
    from outbox.models import DeadLetter

    rows = DeadLetter.objects.using(using).order_by("parked_at", "tenant_id", "id")
    if consumer is not None:
        rows = rows.filter(consumer=consumer)
    if tenant_id is not None:
        rows = rows.filter(tenant_id=tenant_id)
    return [
        Parked(tenant, row_id, name, str(message_id), topic, key, attempts, parked_at, error)
        for tenant, row_id, name, message_id, topic, key, attempts, parked_at, error
        in rows.values_list("tenant_id", "id", "consumer", "message_id", "topic", "key",
                            "attempts", "parked_at", "error")[:limit]
    ]


def parked_counts(using: str) -> dict[str, int]:
    """Parked messages per consumer, of the tenants ``using`` may see."""
    from outbox.models import DeadLetter

    rows = DeadLetter.objects.using(using).values_list("consumer").annotate(n=Count("*"))
    return dict(rows.order_by())


def lock_parked(using: str, tenant_id: int, row_id: int) -> ParkedMessage | None:
    """Lock a dead-letter row for re-driving, or None when missing or locked by someone else."""
    from outbox.models import DeadLetter

    found = list(
        DeadLetter.objects.using(using)
        .select_for_update(skip_locked=True)
        .filter(tenant_id=tenant_id, id=row_id)[:1]
    )
    if not found:
        return None
    row = found[0]
    message = Message(
        id=row.message_pk, message_id=row.message_id, tenant_id=row.tenant_id, topic=row.topic,
        payload=row.payload, key=row.key, aggregate_type=row.aggregate_type,
        aggregate_id=row.aggregate_id, headers=row.headers or {},
        created_at=row.message_created_at,
    )
    return ParkedMessage(row.consumer, message)


def delete_parked(using: str, tenant_id: int, row_id: int) -> None:
    """Delete a dead-letter row (its message was handled)."""
    from outbox.models import DeadLetter

    DeadLetter.objects.using(using).filter(tenant_id=tenant_id, id=row_id).delete()


def record_redrive_failure(using: str, tenant_id: int, row_id: int, error: str) -> None:
    """Count one more failed attempt at a dead-letter row, with its error."""
    from outbox.models import DeadLetter

    DeadLetter.objects.using(using).filter(tenant_id=tenant_id, id=row_id).update(
        attempts=F("attempts") + 1, error=error, parked_at=Now()
    )


# -- retention ----------------------------------------------------------------

# Hand-written: a bounded batch along the delivery index, up to a position
# (DELETE has no LIMIT; the row comparison on xid8 has no ORM lookup).
_DELETE_PASSED = """
DELETE FROM outbox_messages
 WHERE (tenant_id, id) IN (
        SELECT tenant_id, id FROM outbox_messages
         WHERE (xid, id) <= (%s::xid8, %s)
           AND created_at < now() - make_interval(secs => %s)
         ORDER BY xid, id
         LIMIT %s)
"""

# Hand-written: a bounded batch of one tenant's rows along (tenant_id, received_at).
_DELETE_RECEIVED = """
DELETE FROM outbox_received
 WHERE (tenant_id, receiver, message_id) IN (
        SELECT tenant_id, receiver, message_id FROM outbox_received
         WHERE tenant_id = %s AND received_at < now() - make_interval(secs => %s)
         LIMIT %s)
"""


def delete_passed_messages(
    using: str, upto: tuple[int, int], older_than: float, limit: int
) -> int:
    """Delete up to ``limit`` messages at or below ``upto`` and older than ``older_than`` seconds.

    Returns:
        How many were deleted (fewer than ``limit``: none is left).
    """
    with connections[using].cursor() as cursor:
        cursor.execute(_DELETE_PASSED, [str(upto[0]), upto[1], older_than, limit])
        return cursor.rowcount


def delete_received(using: str, tenant_id: int, older_than: float, limit: int) -> int:
    """Delete up to ``limit`` of a tenant's receiver records older than ``older_than`` seconds.

    Returns:
        How many were deleted (fewer than ``limit``: none is left).
    """
    with connections[using].cursor() as cursor:
        cursor.execute(_DELETE_RECEIVED, [tenant_id, older_than, limit])
        return cursor.rowcount


# -- status -------------------------------------------------------------------

# Hand-written: a row comparison on xid8 per reader, counted below the fence.
_READER_LAGS = """
SELECT o.name, o.partition, o.partition_count, o.last_xid::text, o.last_id,
       (SELECT count(*) FROM outbox_messages m
         WHERE (m.xid, m.id) > (o.last_xid, o.last_id) AND m.xid < %s::xid8),
       now() - o.last_processed_at, o.attempts, o.last_error
  FROM consumer_offsets o
 ORDER BY o.name, o.partition
"""


def reader_lags(using: str, fence: int) -> list[ReaderLag]:
    """Every reader, with how many messages below ``fence`` it has still to pass."""
    with connections[using].cursor() as cursor:
        cursor.execute(_READER_LAGS, [str(fence)])
        rows = cursor.fetchall()
    return [
        ReaderLag(name, partition, count, (int(xid), last_id), behind, age, attempts, error)
        for name, partition, count, xid, last_id, behind, age, attempts, error in rows
    ]


def count_messages(using: str) -> int:
    """Messages in the outbox (of the tenants ``using`` may see)."""
    from outbox.models import OutboxMessage

    return OutboxMessage.objects.using(using).count()


def count_held_back(using: str, fence: int) -> int:
    """Committed messages at or above ``fence``: waiting for an older transaction to end."""
    # Hand-written: compares with the fence as xid8.
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM outbox_messages WHERE xid >= %s::xid8", [str(fence)])
        return int(cursor.fetchone()[0])


def oldest_unpassed_age(using: str, after: tuple[int, int]) -> timedelta | None:
    """The age of the first message after ``after`` (None: there is none)."""
    # Hand-written: the first row after a position, along the (xid, id) index,
    # aged by the database clock.
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT now() - min(created_at) FROM (SELECT created_at FROM outbox_messages"
            " WHERE (xid, id) > (%s::xid8, %s) ORDER BY xid, id LIMIT 1) AS first",
            [str(after[0]), after[1]],
        )
        age: timedelta | None = cursor.fetchone()[0]
        return age


# Hand-written: the server's catalogs. pg_locks shows every backend's own
# transaction-id lock to every role; pg_stat_activity shows other roles'
# details only to pg_read_all_stats. A transaction id lock holds the low 32
# bits of the 64-bit fence.
_BLOCKER = """
SELECT l.pid, %s::bigint, now() - a.xact_start, a.state, a.query, a.datname, a.usename
  FROM pg_locks l
  LEFT JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
   AND l.transactionid::text::bigint = (%s::bigint %% 4294967296)
 LIMIT 1
"""

_PREPARED_BLOCKER = """
SELECT NULL::int, %s::bigint, now() - prepared, 'prepared', gid, database, owner
  FROM pg_prepared_xacts WHERE transaction::text::bigint = (%s::bigint %% 4294967296)
"""


def find_blocker(using: str, fence: int) -> Blocker | None:
    """The open (or prepared) transaction whose id is ``fence``, if it is still there."""
    with connections[using].cursor() as cursor:
        cursor.execute(_BLOCKER, [fence, fence])
        row = cursor.fetchone()
        if row is None:
            cursor.execute(_PREPARED_BLOCKER, [fence, fence])
            row = cursor.fetchone()
    if row is None:
        return None
    pid, xid, age, state, query, database, user = row
    return Blocker(pid, int(xid), age, state, query, database, user)


# -- receivers ----------------------------------------------------------------

# Hand-written: one statement that both records the id and says whether it was
# new; concurrent duplicates wait on the primary key (get_or_create would need
# a savepoint and a second statement).
_RECORD_RECEIVED = """
INSERT INTO outbox_received (tenant_id, receiver, message_id) VALUES (%s, %s, %s)
ON CONFLICT DO NOTHING
"""


def record_received(using: str, tenant_id: int, receiver: str, message_id: uuid.UUID) -> bool:
    """Remember that ``receiver`` handled ``message_id``, as the current tenant.

    Returns:
        False when it already had (a duplicate).
    """
    with connections[using].cursor() as cursor:
        cursor.execute(_RECORD_RECEIVED, [tenant_id, receiver, message_id])
        return cursor.rowcount == 1
