"""Reading the outbox in delivery order without ever skipping a late commit.

A reader remembers the ``(xid, id)`` of the last message it passed and asks
for the next rows in ``(xid, id)`` order, but only rows whose transaction id
is below the oldest transaction still running (``pg_snapshot_xmin``)::

    WHERE (xid, id) > (last_xid, last_id)
      AND xid < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY xid, id

Below that fence every transaction has ended, so no row can still appear
there; a row committed later has a transaction id at or above the fence and
therefore sorts after everything read so far. Reading ``WHERE id > last_id``
instead loses a row whose transaction took its id first and committed last.

The price: one long transaction anywhere on the server holds delivery back
until it ends (``outbox_status`` names it).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Generic, TypeVar

from django.db import connections

#: The position before the first message.
START: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Message:
    """One outbox message as readers and handlers see it.

    Attributes:
        id: the row's id, unique per tenant and increasing in insert order.
        message_id: a UUID unique to this message; receivers de-duplicate by it.
        tenant_id: the tenant that published it; handlers run as this tenant.
        topic: what happened, e.g. ``"order.created"``.
        key: the ordering key (messages with one key reach a consumer in order).
        xid: the publishing transaction's id (the first half of the position).
    """

    id: int
    message_id: uuid.UUID
    tenant_id: int
    topic: str
    payload: Any
    key: str | None = None
    aggregate_type: str | None = None
    aggregate_id: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    xid: int = 0

    @property
    def position(self) -> tuple[int, int]:
        return (self.xid, self.id)

    def envelope(self) -> dict[str, Any]:
        """The message as a JSON-serialisable dict (what the Celery transport sends)."""
        return {
            "id": self.id,
            "message_id": str(self.message_id),
            "tenant_id": self.tenant_id,
            "topic": self.topic,
            "key": self.key,
            "aggregate_type": self.aggregate_type,
            "aggregate_id": self.aggregate_id,
            "payload": self.payload,
            "headers": self.headers,
            "created_at": self.created_at.isoformat() if self.created_at else None,
        }

    @classmethod
    def from_envelope(cls, data: dict[str, Any]) -> Message:
        created = data.get("created_at")
        return cls(
            id=int(data["id"]),
            message_id=uuid.UUID(str(data["message_id"])),
            tenant_id=int(data["tenant_id"]),
            topic=data["topic"],
            payload=data.get("payload"),
            key=data.get("key"),
            aggregate_type=data.get("aggregate_type"),
            aggregate_id=data.get("aggregate_id"),
            headers=data.get("headers") or {},
            created_at=datetime.fromisoformat(created) if created else None,
        )


COLUMNS = (
    "id, message_id, tenant_id, topic, payload, key, aggregate_type, aggregate_id,"
    " headers, created_at, xid::text"
)

#: The partition of a message: a hash of its key, or of its message id when it
#: has no key (such messages promise no order, so they may spread).
#: (``m`` is the alias of outbox_messages.)
PARTITION_OF = (
    "mod(hashtextextended(coalesce(m.key, m.message_id::text), 0) & 9223372036854775807, %s)"
)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def row_to_message(row: Sequence[Any]) -> Message:
    return Message(
        id=row[0],
        message_id=row[1] if isinstance(row[1], uuid.UUID) else uuid.UUID(str(row[1])),
        tenant_id=row[2],
        topic=row[3],
        payload=_json(row[4]),
        key=row[5],
        aggregate_type=row[6],
        aggregate_id=row[7],
        headers=_json(row[8]) or {},
        created_at=row[9],
        xid=int(row[10]),
    )


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message as the relay reads it for a transport that sends JSON.

    PostgreSQL builds the envelope (:meth:`Message.envelope`) as JSON text,
    so the payload passes through the relay as text, never parsed and
    serialised again. The JSON is the same envelope: the same keys in the
    same order, ``created_at`` in UTC as ``datetime.isoformat()`` writes it;
    only the spacing differs, and the payload is exactly what PostgreSQL
    stored (numbers are not rounded through a Python float).

    Attributes:
        id, xid: the position of the message.
        message_id: the message's UUID as text.
        topic: its topic (transports route by it).
        json: the envelope as JSON text.
    """

    id: int
    xid: int
    message_id: str
    topic: str
    json: str

    @property
    def position(self) -> tuple[int, int]:
        return (self.xid, self.id)

    def data(self) -> dict[str, Any]:
        """The envelope as a dict, as :meth:`Message.envelope` returns it."""
        return json.loads(self.json)  # type: ignore[no-any-return]

    def message(self) -> Message:
        """The :class:`Message` (payload and headers decoded)."""
        return replace(Message.from_envelope(self.data()), xid=self.xid)

    @classmethod
    def of(cls, message: Message) -> Envelope:
        return cls(message.id, message.xid, str(message.message_id), message.topic,
                   json.dumps(message.envelope()))


#: The envelope as PostgreSQL writes it: the keys of Message.envelope(), in
#: its order; created_at in UTC, formatted as datetime.isoformat() does (no
#: fraction when it is zero).
ENVELOPE_JSON = """json_build_object(
    'id', m.id, 'message_id', m.message_id, 'tenant_id', m.tenant_id, 'topic', m.topic,
    'key', m.key, 'aggregate_type', m.aggregate_type, 'aggregate_id', m.aggregate_id,
    'payload', m.payload, 'headers', coalesce(nullif(m.headers, 'null'::jsonb), '{}'::jsonb),
    'created_at', to_char(m.created_at AT TIME ZONE 'UTC',
        CASE WHEN extract(microseconds FROM m.created_at)::bigint %% 1000000 = 0
             THEN 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"'
             ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"' END)
)::text"""

ENVELOPE_COLUMNS = "m.id, m.xid::text, m.message_id::text, m.topic, " + ENVELOPE_JSON

M = TypeVar("M", Message, Envelope)


@dataclass(frozen=True)
class Batch(Generic[M]):
    """Messages read in one statement, and the fence of that statement's snapshot.

    Attributes:
        messages: in ``(xid, id)`` order.
        fence: ``pg_snapshot_xmin`` of the snapshot: every transaction with a
            smaller id had ended, so no message below it can still appear.
    """

    messages: list[M]
    fence: int

    @property
    def passed(self) -> tuple[int, int]:
        """The position just below the fence.

        A reader that asked for ``limit`` messages and got fewer has seen
        every message it selects below the fence, so it may move to here even
        when none matched its topics or partition (else a consumer of a rare
        topic would pin retention, and re-scan the same rows on every poll).
        """
        return (self.fence - 1, MAX_ID)


MAX_ID = 2**63 - 1


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

    Run on the system alias (it sees every tenant) as a statement of its own,
    never inside the caller's transaction: the fence and the rows come from the
    same snapshot, taken by this statement.

    Args:
        using: a database alias whose role is not subject to row-level security.
        after: the reader's position, ``(xid, id)`` of the last message passed.
        limit: at most this many messages.
        topics: only these topics (None: all).
        partition, partition_count: only messages whose key hashes to ``partition``.
    """
    columns = ", ".join(f"m.{c.strip()}" for c in COLUMNS.split(","))
    fence, rows = _select(using, columns, after, limit, topics, partition, partition_count)
    messages = [row_to_message(row) for row in rows]
    messages.sort(key=lambda m: m.position)
    return Batch(messages, fence)


def read_envelopes(using: str, after: tuple[int, int], limit: int) -> Batch[Envelope]:
    """As :func:`read_batch` (all topics, one partition), each message as an :class:`Envelope`."""
    fence, rows = _select(using, ENVELOPE_COLUMNS, after, limit, None, 0, 1)
    envelopes = [Envelope(row[0], int(row[1]), row[2], row[3], row[4]) for row in rows]
    envelopes.sort(key=lambda e: e.position)
    return Batch(envelopes, fence)


def _select(
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
        where.append(f"{PARTITION_OF} = %s")
        params += [partition_count, partition]
    params.append(limit)
    sql = f"""
        SELECT f.xmin::text, b.*
          FROM (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin) AS f
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
