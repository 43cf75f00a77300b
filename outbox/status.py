"""What ``outbox_status`` reports: lag, stuck messages, and what holds delivery back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import connections

from tenancy.aliases import system_alias


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
class Status:
    fence: int
    readers: list[ReaderLag]
    oldest_unpassed_age: timedelta | None
    held_back: int
    parked: dict[str, int]
    blocker: Blocker | None
    messages: int


def status(using: str | None = None) -> Status:
    """Collect the outbox's health, as the system role sees it.

    ``blocker`` is the running transaction with the oldest transaction id, when
    messages are waiting behind the fence. Its query text and age need the
    system role to be a member of ``pg_read_all_stats`` (else they are None).
    """
    alias = system_alias(using)
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text")
        fence = int(cursor.fetchone()[0])
        cursor.execute(
            """
            SELECT o.name, o.partition, o.partition_count, o.last_xid::text, o.last_id,
                   (SELECT count(*) FROM outbox_messages m
                     WHERE (m.xid, m.id) > (o.last_xid, o.last_id) AND m.xid < %s::xid8),
                   now() - o.last_processed_at, o.attempts, o.last_error
              FROM consumer_offsets o
             ORDER BY o.name, o.partition
            """,
            [str(fence)],
        )
        readers = [
            ReaderLag(r[0], r[1], r[2], (int(r[3]), r[4]), r[5], r[6], r[7], r[8])
            for r in cursor.fetchall()
        ]
        cursor.execute("SELECT count(*) FROM outbox_messages")
        total = cursor.fetchone()[0]
        cursor.execute(
            "SELECT count(*) FROM outbox_messages WHERE xid >= %s::xid8", [str(fence)]
        )
        held_back = cursor.fetchone()[0]
        oldest = None
        if readers:
            low = min(r.position for r in readers)
            cursor.execute(
                "SELECT now() - min(created_at) FROM (SELECT created_at FROM outbox_messages"
                " WHERE (xid, id) > (%s::xid8, %s) ORDER BY xid, id LIMIT 1) AS first",
                [str(low[0]), low[1]],
            )
            oldest = cursor.fetchone()[0]
        cursor.execute("SELECT consumer, count(*) FROM outbox_dead_letters GROUP BY consumer")
        parked = dict(cursor.fetchall())
        blocker = _blocker(cursor, fence) if held_back else None
    return Status(fence, readers, oldest, held_back, parked, blocker, total)


def _blocker(cursor: object, fence: int) -> Blocker | None:
    # pg_locks shows every backend's own transaction-id lock to every role;
    # pg_stat_activity shows other roles' details only to pg_read_all_stats.
    cursor.execute(  # type: ignore[attr-defined]
        """
        SELECT l.pid, %s::bigint, now() - a.xact_start, a.state, a.query, a.datname, a.usename
          FROM pg_locks l
          LEFT JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
           AND l.transactionid::text::bigint = (%s::bigint %% 4294967296)
         LIMIT 1
        """,
        [fence, fence],
    )
    row = cursor.fetchone()  # type: ignore[attr-defined]
    if row is None:
        cursor.execute(  # type: ignore[attr-defined]
            "SELECT NULL::int, %s::bigint, now() - prepared, 'prepared', gid, database, owner"
            " FROM pg_prepared_xacts WHERE transaction::text::bigint = (%s::bigint %% 4294967296)",
            [fence, fence],
        )
        row = cursor.fetchone()  # type: ignore[attr-defined]
    if row is None:
        return None
    return Blocker(row[0], int(row[1]), row[2], row[3], row[4], row[5], row[6])
