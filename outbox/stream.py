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
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

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


@dataclass(frozen=True)
class Batch:
    """Messages read in one statement, and the fence of that statement's snapshot.

    Attributes:
        messages: in ``(xid, id)`` order.
        fence: ``pg_snapshot_xmin`` of the snapshot: every transaction with a
            smaller id had ended, so no message below it can still appear.
    """

    messages: list[Message]
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
) -> Batch:
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
    where = ["(m.xid, m.id) > (%s::xid8, %s)", "m.xid < f.xmin"]
    params: list[Any] = [str(after[0]), after[1]]
    if topics is not None:
        where.append("m.topic = ANY(%s)")
        params.append(list(topics))
    if partition_count > 1:
        where.append(f"{PARTITION_OF} = %s")
        params += [partition_count, partition]
    params.append(limit)
    columns = ", ".join(f"m.{c.strip()}" for c in COLUMNS.split(","))
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
    messages = [row_to_message(row[1:]) for row in rows if row[1] is not None]
    messages.sort(key=lambda m: m.position)
    return Batch(messages, fence)
