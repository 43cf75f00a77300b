"""Every hand-written statement on the outbox's tables, and the rows they return.

The statements are in ``outbox/queries.sql``, each with the reason it is not
the ORM's; a function here sends one of them, on the alias its caller names
(:mod:`tenancy.aliases` decides which role does what), in whatever transaction
the caller has open, and returns typed rows, never positional tuples. What may
be read is decided in one place, ``outbox_read_v2()`` (:func:`read_batch`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from django_idempotency_outbox.sqlfiles import queries
from outbox.stream import Batch, Envelope, Message, Position
from tenancy.statements import affected, fetch_all, fetch_one

#: The app's statements, by name (outbox/queries.sql).
SQL = queries("outbox")


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


def _jsonb(value: Any) -> Any:
    """A jsonb value from a raw row, decoded (Django has psycopg return jsonb as text)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


#: JSON text for ``%s::jsonb`` parameters, as Django encodes dates, decimals and UUIDs
#: (one encoder for every call: ``json.dumps(value, cls=...)`` makes one each time).
_to_jsonb = DjangoJSONEncoder().encode


def insert_message(using: str, fields: Mapping[str, Any], headers: dict[str, Any]) -> None:
    """Write one message in the caller's transaction, as the current tenant.

    ``fields`` are its other columns, as ``publish()`` gathers them
    (``tenant_id``, ``message_id``, ``topic``, ``key``, ``aggregate_type``,
    ``aggregate_id``, ``payload``).

    Raises:
        TypeError: the payload or headers are not JSON-serialisable (before
            anything is sent to the database).
    """
    params = {**fields, "payload": _to_jsonb(fields["payload"]),
              "headers": _to_jsonb(headers) if headers else "{}"}
    affected(using, SQL["publish"], params)


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

    The read that makes positions gap-safe (docs/guarantees.md has the whole
    argument). Reading ``WHERE id > last_id`` alone loses a row whose
    transaction took its id first and committed last. So every transaction
    that writes a message first marks itself (``outbox_mark_publisher_v2()``)
    with transaction-level locks naming the message's tenant, beside a proof
    only the trigger can compute, and a bound below every id it takes; and
    ``outbox_read_v2()`` takes, in this order::

        A := the last id handed out             -- read first
        W := the publishers in flight           -- pg_locks: tenant -> lowest bound b
        SELECT ... in a new snapshot            -- rows after the position, up to A,
                                                -- but of a tenant in W only up to b

    A row at or below A was written by a transaction marked before A was
    read: still open when W was read, it holds the row's tenant back below
    the row; else it ended before the snapshot (a transaction is visible
    before its locks are released), which sees the row unless it was rolled
    back. The price: a publishing transaction left open holds back its own
    tenants' later messages, no one else's (``outbox_status`` names it).

    Run on the system alias (it sees every tenant), under READ COMMITTED
    (``outbox_read_v2()`` needs a new snapshot for its last statement), in a
    statement of its own.

    Args:
        using: a database alias whose role is not subject to row-level security.
        position: the reader's position.
        limit: at most this many messages.
        topics: only these topics (None: all).
        partition, partition_count: only messages whose key hashes to ``partition``.
    """
    allocated, in_flight, rows = _read(using, "read_messages", position, limit, {
        "topics": None if topics is None else list(topics),
        "partition": partition, "partitions": partition_count,
    })
    messages = sorted((_message(row) for row in rows), key=lambda m: m.id)
    return Batch(messages, allocated, in_flight, limit)


def read_envelopes(using: str, position: Position, limit: int) -> Batch[Envelope]:
    """As :func:`read_batch` (all topics, one partition), each message as an :class:`Envelope`.

    PostgreSQL writes each envelope's JSON, in the same statement and snapshot.
    """
    allocated, in_flight, rows = _read(using, "read_envelopes", position, limit, {})
    envelopes = sorted(
        (Envelope(id_, int(xid), message_id, topic, text)
         for id_, xid, message_id, topic, text in rows),
        key=lambda e: e.id,
    )
    return Batch(envelopes, allocated, in_flight, limit)


def _message(row: Sequence[Any]) -> Message:
    (id_, message_id, tenant_id, topic, payload, key, aggregate_type, aggregate_id, headers,
     created_at, xid) = row
    if not isinstance(message_id, uuid.UUID):
        message_id = uuid.UUID(str(message_id))
    return Message(id_, message_id, tenant_id, topic, _jsonb(payload), key, aggregate_type,
                   aggregate_id, _jsonb(headers) or {}, created_at, int(xid))


def _read(
    using: str, statement: str, position: Position, limit: int, params: dict[str, Any]
) -> tuple[int, dict[int, int], list[Sequence[Any]]]:
    """The last id handed out, the publishers in flight and the next rows, as ``statement``
    (``read_messages`` or ``read_envelopes``) selects them (see :func:`read_batch`)."""
    params = {"after": position.last, "held": position.json(), "limit": limit, **params}
    found = fetch_all(using, SQL[statement], params)
    # A publisher for any tenant ("*") caps ``allocated`` already (outbox_read_v2()).
    allocated = int(found[0][0])
    in_flight = {int(tenant): int(bound) for tenant, bound in json.loads(found[0][1]).items()
                 if tenant != "*"}
    return allocated, in_flight, [row[2:] for row in found if row[2] is not None]


def partition_counts(using: str, name: str) -> set[int]:
    """The partition counts of the offset rows named ``name`` (empty: none yet)."""
    return {int(row[0]) for row in fetch_all(using, SQL["partition_counts"], {"name": name})}


def create_offsets(using: str, name: str, partitions: int) -> int:
    """Create the offset rows ``name`` 0..partitions-1 at the start of the outbox, if missing.

    Returns:
        How many rows were created.
    """
    return affected(using, SQL["create_offsets"], {"name": name, "partitions": partitions})


def lock_offset(
    using: str, name: str, partition: int, *, lost_after: float = 0.0
) -> OffsetRow | None:
    """Lock a consumer partition's offset row until the caller's transaction ends.

    The batch's first statement: its names are pinned for the whole batch
    (:func:`tenancy.statements.execute`), so the row locked is the offset
    row, never a temporary table's.

    Args:
        lost_after: when positive, for the rest of the transaction the server
            ends this session once its client has not answered for about this
            many seconds (a host that vanished without closing its
            connections), which releases the lock. 0 leaves the server's
            settings alone.

    Returns:
        The row, or None when another worker holds it (or it does not exist).
    """
    params: dict[str, Any] = {"name": name, "partition": partition}
    statement = "lock_offset"
    if lost_after > 0:
        seconds = max(1, round(lost_after))
        params.update(count=str(max(1, seconds - 1)), timeout_ms=str(seconds * 1000))
        statement = "lock_offset_watching_client"
    row = fetch_one(using, SQL[statement], params)
    if row is None:
        return None
    last_id, held, attempts, waiting, stale = row[:5]
    return OffsetRow(Position.of_row(last_id, held), attempts, waiting, stale)


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
    affected(using, SQL["advance_offset"], {
        "last_id": position.last, "held": position.json(), "attempts": attempts,
        "retry_in": retry_in, "name": name, "partition": partition,
    })


def record_failure(
    using: str, consumer: str, partition: int, message: Message, failure: HeadFailure
) -> None:
    """Keep the error of ``message`` at the head of a partition, as its tenant (the caller's
    context): the tenant's own row of ``outbox_consumer_failures``, under row-level security."""
    affected(using, SQL["record_failure"], {
        "tenant_id": message.tenant_id, "consumer": consumer, "partition": partition,
        "message_pk": message.id, "message_id": message.message_id,
        "attempts": failure.attempts, "error": failure.error,
    })


def reader_positions(using: str) -> list[ReaderPosition]:
    """Every reader's position (all consumer partitions and relays)."""
    # Imported here: publish() imports this module, maybe before the app registry is ready.
    from outbox.models import ConsumerOffset

    rows = ConsumerOffset.objects.using(using).values_list("name", "partition", "last_id", "held")
    return [
        ReaderPosition(name, partition, Position.of_row(last_id, held))
        for name, partition, last_id, held in rows
    ]


def advance_leased(
    using: str, name: str, owner: str, expected: Position, position: Position
) -> bool:
    """Move the offset row ``name`` from ``expected`` to ``position`` if ``owner`` holds its lease.

    Returns:
        False when the row was not at ``expected`` or the lease is another's.
    """
    return affected(using, SQL["advance_leased"], {
        "last_id": position.last, "held": position.json(), "name": name,
        "expected_last_id": expected.last, "expected_held": expected.json(), "owner": owner,
    }) == 1


# Rewinding the relay: the only statements that know "the position just before a
# message" (id - 1 in the delivery order, queries.sql), where a reader reads it next.
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


def _mark(row: Sequence[Any] | None) -> StreamMark | None:
    if row is None:
        return None
    before, message_id, created_at = row
    return StreamMark(int(before), message_id, created_at)


def mark_of_message(using: str, message_id: uuid.UUID) -> StreamMark | None:
    """The message ``message_id`` as a place to rewind to (None: not in the outbox)."""
    return _mark(fetch_one(using, SQL["mark_of_message"], {"message_id": message_id}))


def first_mark_since(using: str, since: datetime) -> StreamMark | None:
    """The first message in delivery order published at or after ``since`` (None: none).

    A reader set just before it reads every message published since then
    (and maybe some published a little earlier, which sort after it).
    """
    return _mark(fetch_one(using, SQL["first_mark_since"], {"since": since}))


def oldest_mark(using: str) -> StreamMark | None:
    """The oldest message still kept (None: the outbox is empty)."""
    return _mark(fetch_one(using, SQL["oldest_mark"]))


def count_between(using: str, after: int, upto: Position) -> dict[str, int]:
    """Messages after position ``after`` that ``upto`` has passed, per topic."""
    params = {"after": after, "upto": upto.last, "held": upto.json()}
    return {topic: int(n) for topic, n in fetch_all(using, SQL["count_between"], params)}


def set_relay_position(using: str, name: str, position: int) -> bool:
    """Move the relay offset row ``name`` back to ``position`` and drop its lease.

    Held tenants at or past ``position`` are no longer held: the relay reads
    everything after ``position`` again, theirs included.

    Returns:
        False when the row does not exist or is not after ``position``.
    """
    params = {"position": position, "name": name}
    return affected(using, SQL["set_relay_position"], params) == 1


def database_now(using: str) -> datetime:
    """The database clock (every time comparison of the library uses it)."""
    now: datetime = fetch_one(using, SQL["database_now"])[0]
    return now


def park(using: str, consumer: str, message: Message, attempts: int, error: str) -> None:
    """Copy ``message`` into the dead-letter table, as its tenant (the caller's context)."""
    affected(using, SQL["park"], {
        "tenant_id": message.tenant_id, "consumer": consumer, "message_pk": message.id,
        "message_id": message.message_id, "topic": message.topic, "key": message.key,
        "aggregate_type": message.aggregate_type, "aggregate_id": message.aggregate_id,
        "payload": _to_jsonb(message.payload), "headers": _to_jsonb(message.headers),
        "created_at": message.created_at, "attempts": attempts, "error": error,
    })


def delete_passed_messages(using: str, upto: int, older_than: float, limit: int) -> int:
    """Delete up to ``limit`` messages at or below ``upto`` and older than ``older_than`` seconds.

    Returns:
        How many were deleted (fewer than ``limit``: none is left).
    """
    params = {"upto": upto, "older_than": older_than, "limit": limit}
    return affected(using, SQL["delete_passed_messages"], params)


def delete_received(using: str, tenant_id: int, older_than: float, limit: int) -> int:
    """Delete up to ``limit`` of a tenant's receiver records older than ``older_than`` seconds.

    Returns:
        How many were deleted (fewer than ``limit``: none is left).
    """
    params = {"tenant_id": tenant_id, "older_than": older_than, "limit": limit}
    return affected(using, SQL["delete_received"], params)


def reader_states(using: str) -> list[ReaderState]:
    """Every reader (consumer partitions and relays): what it has passed and what waits."""
    return [
        ReaderState(
            name, partition, count, Position.of_row(last_id, held), int(behind), lag,
            first_tenant, idle, attempts, error or "", failing, lease_left, owner,
        )
        for (name, partition, count, last_id, held, behind, lag, first_tenant, idle, attempts,
             error, failing, lease_left, owner) in fetch_all(using, SQL["reader_states"])
    ]


def last_allocated(using: str) -> int:
    """The last id handed out (0: none yet)."""
    return int(fetch_one(using, SQL["last_allocated"])[0])


def count_waiting(using: str, publishers: Sequence[Publisher]) -> int:
    """Committed messages that wait for one of ``publishers`` to end."""
    if not publishers:
        return 0
    everyone = min((p.bound for p in publishers if p.any_tenant), default=2**63 - 1)
    lowest: dict[int, int] = {}
    for publisher in publishers:
        for tenant in publisher.tenants:
            lowest[tenant] = min(lowest.get(tenant, publisher.bound), publisher.bound)
    params = {"everyone": everyone, "tenants": list(lowest), "bounds": list(lowest.values())}
    return int(fetch_one(using, SQL["count_waiting"], params)[0])


def publishers_in_flight(using: str) -> list[Publisher]:
    """The transactions that published and are still open, lowest bound first."""
    return [
        Publisher(
            pid, tuple(sorted(tenants)), any_tenant, int(bound), since,
            None if since is None else now - since, state, query, user, application,
            int(waiting),
        )
        for (pid, tenants, any_tenant, bound, since, state, query, user, application, waiting,
             now) in fetch_all(using, SQL["publishers"])
    ]


def record_received(using: str, tenant_id: int, receiver: str, message_id: uuid.UUID) -> bool:
    """Remember that ``receiver`` handled ``message_id``, as the current tenant.

    Returns:
        False when it already had (a duplicate).
    """
    params = {"tenant_id": tenant_id, "receiver": receiver, "message_id": message_id}
    return affected(using, SQL["record_received"], params) == 1


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


def fence_facts(using: str) -> FenceFacts | None:
    """The id sequence's parameters, the id column's default and the marking trigger;
    None before migration 0003.

    Raises DatabaseError where the tables cannot be inspected (not migrated yet).
    """
    row = fetch_one(using, SQL["fence_facts"])
    return None if row is None else FenceFacts(*row)
