"""Every statement on the outbox's tables, and the rows they return.

``outbox_messages``, ``consumer_offsets``, ``outbox_consumer_failures``,
``outbox_dead_letters`` and ``outbox_received`` are read and written here and
nowhere else; the other modules of the app decide what to do and call these
functions. Each function
takes the database alias it runs on as its first argument: the caller
decides, through :mod:`tenancy.aliases`, which role does what (the app role
under row-level security, the worker role for offsets and leases, the system
role across tenants), and runs
tenant-scoped statements inside :func:`tenancy.tenant_context`. A function
runs in whatever transaction its caller has open on that alias.

Rows come back as the types below, or as :class:`~outbox.stream.Message`,
:class:`~outbox.stream.Envelope` and :class:`~outbox.stream.Batch`; never as
positional tuples.

The ORM is used where it costs nothing that could be measured; hand-written
SQL where it earns its place, with the reason beside it. What may be read is
decided in one place, the SQL functions of ``outbox/sql/0008_tenant_fence.sql``
(``outbox_read_v2()`` and the publishers in flight it reads,
``outbox_publishers_v2()``); :func:`read_batch` says why it is safe.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connections
from django.db.models import Count, F, Q
from django.db.models.functions import Now

from django_idempotency_outbox.leases import LeaseRow
from outbox.stream import ENVELOPE_KEYS, Batch, Envelope, Message, Position
from tenancy import statements
from tenancy.context import execute_pinned
from tenancy.statements import Statement

# The models are imported by the functions that use them: publish() and
# receive() import this module, and may be imported before Django's app
# registry is ready (e.g. at the top of an app's apps.py).

# -- rows ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetRow:
    """A consumer partition's offset row, locked by the caller's transaction.

    Attributes:
        position: what the partition has passed.
        attempts: failed attempts at the first message after ``position`` (0: none).
        waiting: that message's next attempt is not due yet.
        stale: not advanced for 5 seconds (or never), so moving it past a
            quiet stretch of the stream is worth a write.
    """

    position: Position
    attempts: int
    waiting: bool
    stale: bool


@dataclass(frozen=True, slots=True)
class HeadFailure:
    """Why an offset stopped before a message: the count on the offset row, the error
    in ``outbox_consumer_failures`` (its tenant's row) until it passes.

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
    position: Position


@dataclass(frozen=True)
class Publisher:
    """A transaction that has published and is still open: it holds its tenants back.

    Attributes:
        pid: its backend (None for a prepared transaction).
        tenants: the tenants it published for (their later messages wait).
        any_tenant: it is marked as publishing for any tenant (a tenant's key
            was held by someone else): every tenant's later messages wait.
        bound: the lowest bound its marks name: of those tenants, messages
            with larger ids wait for it (0: all of them not yet passed).
        since: when the transaction began (prepared: when it was prepared);
            None unless the system role may see it (``pg_read_all_stats``).
        state: ``pg_stat_activity.state``, or ``"prepared"``.
        query: its last statement, or the prepared transaction's gid.
        user, application: its role and ``application_name``.
        waiting: committed messages of its tenants that wait for it.
    """

    pid: int | None
    tenants: tuple[int, ...]
    any_tenant: bool
    bound: int
    since: datetime | None
    age: timedelta | None
    state: str | None
    query: str | None
    user: str | None
    application: str | None
    waiting: int = 0


@dataclass(frozen=True)
class ReaderState:
    """One reader (a consumer partition or a relay), as status, health and metrics see it.

    Attributes:
        position: what it has passed.
        behind: committed messages it has not passed yet, held back or not
            (for a consumer with topics or partitions, an upper bound: rows
            of other topics and partitions count until it moves past them).
        lag: the age of the first message (in delivery order) it has not
            passed; None when it has passed every committed message.
        first_unpassed_tenant: that message's tenant.
        last_processed_age: since it last moved (None: never).
        attempts: failed attempts at its head message (0: none).
        last_error, failing_tenant: the head's last error and its tenant, from
            ``outbox_consumer_failures`` (read across tenants by the system role).
        lease_left: relays only: seconds until the lease runs out, negative
            once it has (None: no lease held, e.g. after a clean stop).
        lease_owner: relays only: host:pid:token of the holder ("" when none).
    """

    name: str
    partition: int
    partition_count: int
    position: Position
    behind: int
    lag: timedelta | None
    first_unpassed_tenant: int | None
    last_processed_age: timedelta | None
    attempts: int
    last_error: str
    failing_tenant: int | None
    lease_left: float | None
    lease_owner: str

    @property
    def is_relay(self) -> bool:
        return self.name.startswith("relay:")

    @property
    def where(self) -> str:
        """``name`` for a relay, ``name[partition]`` for a consumer."""
        return self.name if self.is_relay else f"{self.name}[{self.partition}]"


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


#: One encoder for every call: ``json.dumps(value, cls=...)`` would make a new one each time.
_ENCODER = DjangoJSONEncoder()


def _to_jsonb(value: Any) -> str:
    """JSON text for a ``%s::jsonb`` parameter (dates, decimals, UUIDs as Django encodes them).

    Raises:
        TypeError: ``value`` is not JSON-serialisable.
    """
    return _ENCODER.encode(value)


# -- publishing ---------------------------------------------------------------

# Hand-written: one round trip on the caller's hot path. The id and xid come
# from what the models do not know: the trigger outbox_mark_publisher_v2()
# marks this transaction as a publisher in flight for the row's tenant (the
# fence) before it gives the id, and pg_current_xact_id() records the
# transaction.
_INSERT_MESSAGE = """
INSERT INTO outbox_messages
       (tenant_id, message_id, topic, key, aggregate_type, aggregate_id, payload, headers)
VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb)
"""


# On an alias that is not pooled, prepared by the first message that sends it
# on a connection, and sent as EXECUTE from then on
# (tenancy.statements): the server parses and plans it once
# per connection, not once per message.
_INSERT_STATEMENT = Statement.of(
    "outbox_insert", _INSERT_MESSAGE, ["bigint", "uuid", "text", "text", "text", "text", "text",
                                       "text"],
)


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
        _to_jsonb(payload), _to_jsonb(headers) if headers else "{}",
    ]
    cursor = statements.cursor(using)
    known = statements.state(cursor, _INSERT_STATEMENT)
    prepare = known is None and statements.may_prepare(cursor, using)
    if prepare:
        sql = f"{_INSERT_STATEMENT.prepare}; {_INSERT_STATEMENT.call}"
    else:
        sql = _INSERT_STATEMENT.call if known else _INSERT_MESSAGE
    try:
        cursor.execute(sql, params)
    except DatabaseError as exc:
        if prepare:  # did its PREPARE run? Unknown: text on this connection from now on
            statements.record(cursor, (_INSERT_STATEMENT,), prepared=False)
        else:
            statements.forget_if_gone(cursor, exc)
        raise
    if prepare:
        statements.record(cursor, (_INSERT_STATEMENT,), prepared=True)


# -- the stream ---------------------------------------------------------------

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


def read_batch(
    using: str,
    position: Position,
    limit: int,
    *,
    topics: Sequence[str] | None = None,
    partition: int = 0,
    partition_count: int = 1,
) -> Batch[Message]:
    """The next messages a reader at ``position`` may pass, in id order.

    This is the read that makes positions gap-safe. Every transaction that
    writes a message marks itself, before the message's id is taken, with
    transaction-level locks that name the message's tenant (with its proof: a
    key only the trigger can compute, for this transaction and tenant) and a
    bound below every id the transaction takes (the trigger
    ``outbox_mark_publisher_v2()``), and holds them until it ends. The read
    (``outbox_read_v2()``) then takes, in this order::

        A := the last id handed out             -- read first
        W := the publishers in flight           -- pg_locks: tenant -> lowest bound b
        SELECT ... in a new snapshot            -- rows after the position, up to A,
                                                -- but of a tenant in W only up to b

    A row of tenant t with an id at or below A was written by a transaction
    that had marked itself before A was read. If that transaction was still
    open when W was read, W holds t at a bound below the row's id, and the
    row is not read; else it had ended before the snapshot was taken (a
    transaction is visible before its locks are released), so the snapshot
    sees the row, or it was rolled back. So nothing this read passes can
    still appear behind the reader, of any tenant; a row committed later
    either has an id above A, or is of a tenant the reader holds back
    (:class:`~outbox.stream.Position`) and reads when its publisher ends.
    (docs/guarantees.md has the whole argument.) Reading ``WHERE id >
    last_id`` without this loses a row whose transaction took its id first
    and committed last.

    The price: a publishing transaction that stays open holds back the
    messages of its own tenants with larger ids until it ends
    (``outbox_status`` names it); other tenants' messages, and other
    transactions, however long, are not held back. A transaction's marks
    count only while it holds the outbox's write lock (a lock a session keeps
    after its transaction holds nothing back), and a tenant's mark only beside
    its proof: only a transaction that inserted a message of a tenant holds
    that tenant back, whatever locks another takes.

    Run on the system alias (it sees every tenant), under READ COMMITTED
    (``outbox_read_v2()`` refuses anything else: it needs a new snapshot for
    its last statement), in a statement of its own.

    Args:
        using: a database alias whose role is not subject to row-level security.
        position: the reader's position.
        limit: at most this many messages.
        topics: only these topics (None: all).
        partition, partition_count: only messages whose key hashes to ``partition``.
    """
    allocated, in_flight, rows = _read(
        using, _MESSAGE_COLUMNS, position, limit, topics, partition, partition_count
    )
    messages = sorted((_message(row) for row in rows), key=lambda m: m.id)
    return Batch(messages, allocated, in_flight, limit)


def read_envelopes(using: str, position: Position, limit: int) -> Batch[Envelope]:
    """As :func:`read_batch` (all topics, one partition), each message as an :class:`Envelope`.

    PostgreSQL writes each envelope's JSON, in the same statement and snapshot.
    """
    allocated, in_flight, rows = _read(using, _ENVELOPE_COLUMNS, position, limit, None, 0, 1)
    envelopes = sorted(
        (Envelope(id_, int(xid), message_id, topic, text)
         for id_, xid, message_id, topic, text in rows),
        key=lambda e: e.id,
    )
    return Batch(envelopes, allocated, in_flight, limit)


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


def _read(
    using: str,
    columns: str,
    position: Position,
    limit: int,
    topics: Sequence[str] | None,
    partition: int,
    partition_count: int,
) -> tuple[int, dict[int, int], list[Sequence[Any]]]:
    """The last id handed out, the publishers in flight and the selected ``columns`` of the
    next rows (see :func:`read_batch`)."""
    # Hand-written: outbox_read_v2() reads the last id handed out and the
    # publishers in flight, and then the rows in a snapshot of its own, taken
    # after both, in one round trip (one SELECT could not: its snapshot is
    # taken before anything in it runs). It returns the first two alone when
    # no row matches; ``m`` is each row's columns.
    sql = f"""
        SELECT r.allocated, r.in_flight::text, {columns}
          FROM outbox_read_v2(%s, %s::jsonb, %s, %s, %s, %s) AS r
         CROSS JOIN LATERAL (SELECT (r.message).*) AS m
    """
    params: list[Any] = [
        position.last, position.json(), limit, None if topics is None else list(topics),
        partition, partition_count,
    ]
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    # A publisher for any tenant ("*") caps ``allocated`` already (outbox_read_v2()).
    allocated = int(rows[0][0])
    in_flight = {int(tenant): int(bound) for tenant, bound in json.loads(rows[0][1]).items()
                 if tenant != "*"}
    return allocated, in_flight, [row[2:] for row in rows if row[2] is not None]


# -- consumer offsets ---------------------------------------------------------


# Hand-written: on the worker alias outside any transaction of the library's,
# so its names are pinned (tenancy.context.execute_pinned).
_PARTITION_COUNTS = "SELECT DISTINCT partition_count FROM consumer_offsets WHERE name = %s"


def partition_counts(using: str, name: str) -> set[int]:
    """The partition counts of the offset rows named ``name`` (empty: none yet)."""
    with connections[using].cursor() as cursor:
        execute_pinned(cursor, using, _PARTITION_COUNTS, [name])
        return {int(row[0]) for row in cursor.fetchall()}


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
        execute_pinned(cursor, using, _CREATE_OFFSETS, [name, partitions, partitions])
        return int(cursor.rowcount)


# Hand-written: SKIP LOCKED (another worker has the partition: move on), and
# the clock comparisons made by the database, on the consumer's hot path.
_LOCK_OFFSET = """
SELECT last_id, held::text, attempts, coalesce(retry_at > now(), false),
       coalesce(last_processed_at < now() - interval '5 seconds', true){watch}
  FROM consumer_offsets
 WHERE name = %s AND partition = %s
   FOR UPDATE SKIP LOCKED
"""

# While the batch holds the row lock, the server should notice at once a
# client host that is gone (no FIN: a power cut, a lost network), so that the
# lock is released and another worker takes the partition: TCP keepalives
# every second after a second of silence, a limit on unacknowledged data, and
# checks of the socket while a statement runs (PostgreSQL 14+). Set for the
# batch transaction only (set_config(..., true)), in the statement that takes
# the lock (no extra round trip); the database restores the previous values at
# COMMIT or ROLLBACK. Only the list's target values vary.
_WATCH_CLIENT = """,
       set_config('tcp_keepalives_idle', '1', true),
       set_config('tcp_keepalives_interval', '1', true),
       set_config('tcp_keepalives_count', %s, true),
       set_config('tcp_user_timeout', %s, true),
       set_config('client_connection_check_interval', '1000', true)"""


def lock_offset(
    using: str, name: str, partition: int, *, lost_after: float = 0.0
) -> OffsetRow | None:
    """Lock a consumer partition's offset row until the caller's transaction ends.

    Args:
        lost_after: when positive, for the rest of the transaction the server
            ends this session once its client has not answered for about this
            many seconds (a host that vanished without closing its
            connections), which releases the lock. 0 leaves the server's
            settings alone.

    Returns:
        The row, or None when another worker holds it (or it does not exist).
    """
    params: list[Any] = []
    watch = ""
    if lost_after > 0:
        seconds = max(1, round(lost_after))
        watch = _WATCH_CLIENT
        params += [str(max(1, seconds - 1)), str(seconds * 1000)]
    with connections[using].cursor() as cursor:
        # The batch's first statement: its names pinned for the whole batch,
        # so the row locked is the offset row, never a temporary table's.
        execute_pinned(cursor, using, _LOCK_OFFSET.format(watch=watch),
                       [*params, name, partition])
        row = cursor.fetchone()
    if row is None:
        return None
    last_id, held, attempts, waiting, stale = row[:5]
    return OffsetRow(Position.of_row(last_id, held), attempts, waiting, stale)


# Hand-written: once per batch on the consumer's hot path; retry_at is taken
# from the database clock.
_ADVANCE_OFFSET = """
UPDATE consumer_offsets
   SET last_id = %s, held = %s::jsonb, last_processed_at = now(),
       attempts = %s, retry_at = now() + make_interval(secs => %s)
 WHERE name = %s AND partition = %s
"""


def advance_offset(
    using: str,
    name: str,
    partition: int,
    position: Position,
    failure: HeadFailure | None = None,
) -> None:
    """Move a consumer partition to ``position``, counting (or clearing) its head's failures.

    The error itself is tenant data: :func:`record_failure` keeps it.
    """
    attempts, retry_in = (0, None) if failure is None else (failure.attempts, failure.retry_in)
    with connections[using].cursor() as cursor:
        cursor.execute(_ADVANCE_OFFSET, [
            position.last, position.json(), attempts, retry_in, name, partition,
        ])


# Hand-written: one upsert per failure, as the failing message's tenant.
_RECORD_FAILURE = """
INSERT INTO outbox_consumer_failures
       (tenant_id, consumer, partition, message_pk, message_id, attempts, error)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (tenant_id, consumer, partition) DO UPDATE
   SET message_pk = excluded.message_pk, message_id = excluded.message_id,
       attempts = excluded.attempts, error = excluded.error, failed_at = now()
"""


def record_failure(
    using: str, consumer: str, partition: int, message: Message, failure: HeadFailure
) -> None:
    """Keep the error of ``message`` at the head of a partition, as its tenant (the caller's
    context): the tenant's own row of ``outbox_consumer_failures``, under row-level security."""
    with connections[using].cursor() as cursor:
        cursor.execute(_RECORD_FAILURE, [
            message.tenant_id, consumer, partition, message.id, message.message_id,
            failure.attempts, failure.error,
        ])


def clear_failure(using: str, consumer: str, partition: int) -> None:
    """Forget the current tenant's failure at the head of a partition (it has passed)."""
    from outbox.models import ConsumerFailure

    ConsumerFailure.objects.using(using).filter(consumer=consumer, partition=partition).delete()


def reader_positions(using: str) -> list[ReaderPosition]:
    """Every reader's position (all consumer partitions and relays)."""
    from outbox.models import ConsumerOffset

    rows = ConsumerOffset.objects.using(using).values_list("name", "partition", "last_id", "held")
    return [
        ReaderPosition(name, partition, Position.of_row(last_id, held))
        for name, partition, last_id, held in rows
    ]


# -- the relay's lease --------------------------------------------------------

#: The relay's lease lives on its offset row (partition 0), so that a claim
#: returns the position in the same round trip and the advance below compares
#: the owner in the same statement (django_idempotency_outbox.leases).
RELAY_LEASE = LeaseRow("consumer_offsets", "name = %(name)s AND partition = 0",
                       returning="last_id, held::text")

# Hand-written: a compare-and-set on the old position and the lease owner.
_ADVANCE_LEASED = """
UPDATE consumer_offsets
   SET last_id = %s, held = %s::jsonb, last_processed_at = now()
 WHERE name = %s AND partition = 0 AND last_id = %s AND held = %s::jsonb AND lease_owner = %s
"""


def claim_lease(using: str, name: str, owner: str, seconds: float) -> Position | None:
    """Take or renew the lease on the offset row ``name`` for ``seconds``.

    Creates the row (at the start of the outbox) if it is missing. Each
    statement commits on its own (the caller has no transaction open).

    Returns:
        The row's position, or None while another owner's lease runs.
    """
    lease = {"name": name, "owner": owner, "seconds": seconds}
    with connections[using].cursor() as cursor:
        execute_pinned(cursor, using, RELAY_LEASE.claim, lease)
        row = cursor.fetchone()
        if row is None:
            execute_pinned(cursor, using, _CREATE_OFFSETS, [name, 1, 1])
            if cursor.rowcount:
                execute_pinned(cursor, using, RELAY_LEASE.claim, lease)
                row = cursor.fetchone()
    if row is None:
        return None
    return Position.of_row(*row)


def renew_lease(using: str, name: str, owner: str, seconds: float) -> bool:
    """Extend ``owner``'s lease on the offset row ``name`` to ``seconds`` from now.

    Returns:
        False when the lease is no longer ``owner``'s (another relay took it).
    """
    with connections[using].cursor() as cursor:
        execute_pinned(cursor, using, RELAY_LEASE.renew,
                       {"name": name, "owner": owner, "seconds": seconds})
        return int(cursor.rowcount) == 1


def advance_leased(
    using: str, name: str, owner: str, expected: Position, position: Position
) -> bool:
    """Move the offset row ``name`` from ``expected`` to ``position`` if ``owner`` holds its lease.

    Returns:
        False when the row was not at ``expected`` or the lease is another's.
    """
    with connections[using].cursor() as cursor:
        execute_pinned(cursor, using, _ADVANCE_LEASED, [
            position.last, position.json(), name, expected.last, expected.json(), owner,
        ])
        return int(cursor.rowcount) == 1


def release_lease(using: str, name: str, owner: str) -> None:
    """Give up ``owner``'s lease on the offset row ``name`` (nothing if it is not ``owner``'s)."""
    with connections[using].cursor() as cursor:
        execute_pinned(cursor, using, RELAY_LEASE.release, {"name": name, "owner": owner})


# -- rewinding the relay ------------------------------------------------------
#
# After a broker lost messages the relay had already passed, the relay is set
# back to a position before them and sends everything from there again. These
# are the only statements that know what "the position just before a message"
# is: id - 1 in the id delivery order (_MARK_COLUMNS). A reader set there reads
# the message next, and every message at or after the target, and only those,
# lie above it.


@dataclass(frozen=True, slots=True)
class StreamMark:
    """A message as a place to rewind a reader to.

    Attributes:
        before: the reader position just before the message (its id - 1): a
            reader set there reads the message next.
        message_id, created_at: the message's.
    """

    before: int
    message_id: uuid.UUID
    created_at: datetime


_MARK_COLUMNS = "m.id - 1, m.message_id, m.created_at"

# There is no index on message_id: an operator's one-off lookup scans the outbox.
_MARK_OF_MESSAGE = f"SELECT {_MARK_COLUMNS} FROM outbox_messages AS m WHERE m.message_id = %s"

# Hand-written: the first message in delivery order published at or after a
# time, along the delivery index, filtered. created_at is each transaction's
# start time, which is not the delivery order (a transaction that started
# earlier may take a larger id), hence "first in order", not "first in time":
# every message published since has an id at least this one's.
_FIRST_MARK_SINCE = f"""
SELECT {_MARK_COLUMNS} FROM outbox_messages AS m
 WHERE m.created_at >= %s ORDER BY m.id LIMIT 1
"""

_OLDEST_MARK = f"SELECT {_MARK_COLUMNS} FROM outbox_messages AS m ORDER BY m.created_at LIMIT 1"

# Hand-written: messages a reader moved from a position back to ``after``
# reads again (those after it that the position had passed), per topic, along
# the delivery index.
_COUNT_BETWEEN = """
SELECT m.topic, count(*) FROM outbox_messages AS m
 WHERE m.id > %s AND m.id <= %s
   AND m.id <= coalesce((%s::jsonb ->> m.tenant_id::text)::bigint, m.id)
 GROUP BY m.topic ORDER BY m.topic
"""

# Hand-written: only backwards (a forward move would skip messages), and the
# lease is dropped. A relay that holds it notices either way: its heartbeat's
# next renewal finds the lease no longer its own (so it claims the lease again,
# which returns this position, instead of carrying on from the one it
# remembers), and its compare-and-set on the old position and its lease fails
# if it tries to advance first.
_SET_RELAY_POSITION = """
UPDATE consumer_offsets
   SET last_id = %s, last_processed_at = now(),
       held = (SELECT coalesce(jsonb_object_agg(h.tenant, h.upto), '{}'::jsonb)
                 FROM jsonb_each(held) AS h(tenant, upto) WHERE h.upto::bigint < %s),
       lease_owner = '', lease_until = NULL
 WHERE name = %s AND partition = 0 AND last_id > %s
"""


def _mark(row: Sequence[Any] | None) -> StreamMark | None:
    if row is None:
        return None
    before, message_id, created_at = row
    return StreamMark(int(before), message_id, created_at)


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


def count_between(using: str, after: int, upto: Position) -> dict[str, int]:
    """Messages after position ``after`` that ``upto`` has passed, per topic."""
    with connections[using].cursor() as cursor:
        cursor.execute(_COUNT_BETWEEN, [after, upto.last, upto.json()])
        return {topic: int(count) for topic, count in cursor.fetchall()}


def set_relay_position(using: str, name: str, position: int) -> bool:
    """Move the relay offset row ``name`` back to ``position`` and drop its lease.

    Held tenants at or past ``position`` are no longer held: the relay reads
    everything after ``position`` again, theirs included.

    Returns:
        False when the row does not exist or is not after ``position``.
    """
    with connections[using].cursor() as cursor:
        execute_pinned(cursor, using, _SET_RELAY_POSITION, [position, position, name, position])
        return int(cursor.rowcount) == 1


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
# (DELETE has no LIMIT).
_DELETE_PASSED = """
DELETE FROM outbox_messages
 WHERE (tenant_id, id) IN (
        SELECT tenant_id, id FROM outbox_messages
         WHERE id <= %s
           AND created_at < now() - make_interval(secs => %s)
         ORDER BY id
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


def delete_passed_messages(using: str, upto: int, older_than: float, limit: int) -> int:
    """Delete up to ``limit`` messages at or below ``upto`` and older than ``older_than`` seconds.

    Returns:
        How many were deleted (fewer than ``limit``: none is left).
    """
    with connections[using].cursor() as cursor:
        cursor.execute(_DELETE_PASSED, [upto, older_than, limit])
        return int(cursor.rowcount)


def delete_received(using: str, tenant_id: int, older_than: float, limit: int) -> int:
    """Delete up to ``limit`` of a tenant's receiver records older than ``older_than`` seconds.

    Returns:
        How many were deleted (fewer than ``limit``: none is left).
    """
    with connections[using].cursor() as cursor:
        cursor.execute(_DELETE_RECEIVED, [tenant_id, older_than, limit])
        return int(cursor.rowcount)


# -- status -------------------------------------------------------------------

# Hand-written: per reader, along the delivery index and the held tenants'
# (tenant_id, id) ranges, the committed messages it has not passed, the first
# of them in delivery order (its age, by the database clock, and its tenant),
# the head's failure, and the lease by the database clock.
_READER_STATES = """
SELECT o.name, o.partition, o.partition_count, o.last_id, o.held::text,
       (SELECT count(*) FROM outbox_messages AS m WHERE m.id > o.last_id)
         + coalesce((SELECT sum((SELECT count(*) FROM outbox_messages AS m
                                  WHERE m.tenant_id = h.tenant::bigint
                                    AND m.id > h.upto::bigint AND m.id <= o.last_id))
                       FROM jsonb_each_text(o.held) AS h(tenant, upto)), 0),
       now() - first.created_at, first.tenant_id,
       now() - o.last_processed_at, o.attempts, f.error, f.tenant_id,
       extract(epoch FROM o.lease_until - now())::float8, o.lease_owner
  FROM consumer_offsets AS o
  LEFT JOIN LATERAL (
       SELECT x.created_at, x.tenant_id FROM (
              (SELECT m.id, m.created_at, m.tenant_id FROM outbox_messages AS m
                WHERE m.id > o.last_id ORDER BY m.id LIMIT 1)
              UNION ALL
              (SELECT c.id, c.created_at, c.tenant_id
                 FROM jsonb_each_text(o.held) AS h(tenant, upto)
                CROSS JOIN LATERAL (
                      SELECT m.id, m.created_at, m.tenant_id FROM outbox_messages AS m
                       WHERE m.tenant_id = h.tenant::bigint
                         AND m.id > h.upto::bigint AND m.id <= o.last_id
                       ORDER BY m.id LIMIT 1) AS c)
            ) AS x
        ORDER BY x.id LIMIT 1) AS first ON true
  LEFT JOIN LATERAL (
       SELECT f.error, f.tenant_id FROM outbox_consumer_failures AS f
        WHERE f.consumer = o.name AND f.partition = o.partition
          AND f.message_pk > coalesce((o.held ->> f.tenant_id::text)::bigint, o.last_id)
        ORDER BY f.failed_at DESC LIMIT 1) AS f ON o.attempts > 0
 ORDER BY o.name, o.partition
"""


def reader_states(using: str) -> list[ReaderState]:
    """Every reader (consumer partitions and relays): what it has passed and what waits."""
    with connections[using].cursor() as cursor:
        cursor.execute(_READER_STATES)
        rows = cursor.fetchall()
    return [
        ReaderState(
            name, partition, count, Position.of_row(last_id, held), int(behind), lag,
            first_tenant, idle, attempts, error or "", failing, lease_left, owner,
        )
        for (name, partition, count, last_id, held, behind, lag, first_tenant, idle, attempts,
             error, failing, lease_left, owner) in rows
    ]


def count_messages(using: str) -> int:
    """Messages in the outbox (of the tenants ``using`` may see)."""
    from outbox.models import OutboxMessage

    return OutboxMessage.objects.using(using).count()


def last_allocated(using: str) -> int:
    """The last id handed out (0: none yet)."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT outbox_last_id_v2()")
        return int(cursor.fetchone()[0])


# Hand-written: the server's catalogs. The publishers in flight are found by
# their marks, as the reads find them (outbox_publishers_v2(): pg_locks shows
# every backend's locks to every role); pg_stat_activity shows other roles'
# query, state and start only to pg_read_all_stats. A prepared transaction
# has no backend: its transaction-id lock, under the same virtual
# transaction, leads to its gid. Each publisher's waiting messages are
# counted along (tenant_id, id).
_PUBLISHERS = """
WITH p AS (
    SELECT o.virtualtransaction, o.pid,
           coalesce(array_agg(DISTINCT o.tenant_id) FILTER (WHERE o.tenant_id IS NOT NULL),
                    '{}') AS tenants,
           bool_or(o.tenant_id IS NULL) AS any_tenant, min(o.bound) AS bound
      FROM outbox_publishers_v2() AS o
     GROUP BY o.virtualtransaction, o.pid
)
SELECT p.pid, p.tenants, p.any_tenant, p.bound,
       coalesce(a.xact_start, x.prepared),
       CASE WHEN p.pid IS NULL THEN 'prepared' ELSE a.state END,
       coalesce(a.query, x.gid), coalesce(a.usename, x.owner), a.application_name,
       (SELECT count(*) FROM outbox_messages AS m
         WHERE (p.any_tenant OR m.tenant_id = ANY (p.tenants)) AND m.id > p.bound),
       now()
  FROM p
  LEFT JOIN pg_stat_activity AS a ON a.pid = p.pid
  LEFT JOIN LATERAL (
       SELECT x.gid, x.prepared, x.owner
         FROM pg_locks AS t JOIN pg_prepared_xacts AS x ON x.transaction = t.transactionid
        WHERE p.pid IS NULL AND t.pid IS NULL AND t.locktype = 'transactionid'
          AND t.virtualtransaction = p.virtualtransaction
        LIMIT 1) AS x ON true
 ORDER BY p.bound, p.pid NULLS FIRST
"""


# Hand-written: the committed messages above the lowest bound of a publisher
# for any tenant (if one is in flight), and, below it, per tenant held back,
# those above the lowest bound naming it, along (tenant_id, id).
_COUNT_WAITING = """
SELECT (SELECT count(*) FROM outbox_messages AS m WHERE m.id > %s)
       + coalesce(sum((SELECT count(*) FROM outbox_messages AS m
                        WHERE m.tenant_id = w.tenant AND m.id > w.bound AND m.id <= %s)), 0)
  FROM unnest(%s::bigint[], %s::bigint[]) AS w(tenant, bound)
"""


def count_waiting(using: str, publishers: Sequence[Publisher]) -> int:
    """Committed messages that wait for one of ``publishers`` to end."""
    if not publishers:
        return 0
    everyone = min((p.bound for p in publishers if p.any_tenant), default=2**63 - 1)
    lowest: dict[int, int] = {}
    for publisher in publishers:
        for tenant in publisher.tenants:
            lowest[tenant] = min(lowest.get(tenant, publisher.bound), publisher.bound)
    with connections[using].cursor() as cursor:
        cursor.execute(_COUNT_WAITING, [everyone, everyone, list(lowest), list(lowest.values())])
        return int(cursor.fetchone()[0])


def publishers_in_flight(using: str) -> list[Publisher]:
    """The transactions that published and are still open, lowest bound first."""
    with connections[using].cursor() as cursor:
        cursor.execute(_PUBLISHERS)
        rows = cursor.fetchall()
    return [
        Publisher(
            pid, tuple(sorted(tenants)), any_tenant, int(bound), since,
            None if since is None else now - since, state, query, user, application,
            int(waiting),
        )
        for (pid, tenants, any_tenant, bound, since, state, query, user, application, waiting,
             now) in rows
    ]


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
        return int(cursor.rowcount) == 1


# -- the fence's facts (system checks) ----------------------------------------


@dataclass(frozen=True, slots=True)
class FenceFacts:
    """What the fence rests on, as the catalog says it is now."""

    cache: int  #: values the id sequence hands out per session at once (must be 1)
    increment: int  #: must be positive
    cycle: bool  #: must be False
    id_default: str | None  #: the id column's default (must be None: the trigger gives ids)
    #: ``pg_trigger.tgenabled`` of the trigger that calls ``outbox_mark_publisher_v2()``
    #: before each insert ('O' or 'A': it fires; None: there is none)
    marking: str | None
    #: whether ``outbox_mark_publisher_v2()`` exists (False: before migration 0008)
    marker_exists: bool = True


# Hand-written: catalog queries only, no ORM model covers them.
_FENCE_FACTS = """
SELECT s.seqcache, s.seqincrement, s.seqcycle,
       (SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef AS d
         WHERE d.adrelid = 'outbox_messages'::regclass
           AND d.adnum = (SELECT attnum FROM pg_attribute
                           WHERE attrelid = 'outbox_messages'::regclass AND attname = 'id')),
       (SELECT max(t.tgenabled) FROM pg_trigger AS t
         WHERE t.tgrelid = 'outbox_messages'::regclass
           AND t.tgfoid = to_regprocedure('outbox_mark_publisher_v2()')
           AND t.tgtype & 7 = 7),  -- ROW, BEFORE, INSERT
       to_regprocedure('outbox_mark_publisher_v2()') IS NOT NULL
  FROM pg_sequence AS s
 WHERE s.seqrelid = to_regclass('outbox_message_ids')
"""


def fence_facts(using: str) -> FenceFacts | None:
    """The id sequence's parameters, the id column's default and the marking trigger;
    None before migration 0003.

    Raises DatabaseError where the tables cannot be inspected (not migrated yet).
    """
    with connections[using].cursor() as cursor:
        cursor.execute(_FENCE_FACTS)
        row = cursor.fetchone()
    return None if row is None else FenceFacts(*row)


# -- the admin -----------------------------------------------------------------


def discard_parked(using: str, rows: Sequence[tuple[int, int]]) -> int:
    """Delete dead-letter rows ``(tenant_id, id)`` without handling them; return how many."""
    from outbox.models import DeadLetter

    if not rows:
        return 0
    match = Q()
    for tenant_id, row_id in rows:
        match |= Q(tenant_id=tenant_id, id=row_id)
    deleted, _ = DeadLetter.objects.using(using).filter(match).delete()
    return deleted
