"""Deleting expired idempotency keys of every tenant.

The reaper runs on the system alias (``TENANCY["SYSTEM_DATABASE"]``), whose
role sees every tenant's keys. It walks the tenants that have keys, and for
each deletes expired finished rows in bounded batches, one short transaction
per batch, skipping rows that a live request has locked. Pending keys (phases
mode) are never deleted, since their work may be half done: they are reported
instead, for the completer or a human. One reaper runs at a time: a
second one finds the advisory lock taken and returns at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime

from django.db import connections, transaction

from idempotency.conf import idempotency_settings
from tenancy.aliases import system_alias
from tenancy.db import require_cross_tenant, tenants_with_rows
from tenancy.exceptions import CrossTenantRefused

#: The reaper's refusal of an RLS-bound alias (the library's one cross-tenant error).
ReaperRefused = CrossTenantRefused

#: Session advisory lock held while a reaper runs ("idem-rea" in ASCII).
REAP_LOCK_ID = 0x6964656D2D726561

_DELETE_BATCH = """
DELETE FROM idempotency_keys
 WHERE ctid = ANY(ARRAY(
       SELECT ctid FROM idempotency_keys
        WHERE tenant_id = %s AND expires_at <= now() AND state <> 'pending'
        ORDER BY expires_at
        LIMIT %s
        FOR UPDATE SKIP LOCKED))
"""

_COUNT_EXPIRED = """
SELECT count(*) FROM idempotency_keys
 WHERE tenant_id = %s AND expires_at <= now() AND state <> 'pending'
"""

# Pending keys that nothing is working on (no live lease) for a long time.
_STUCK = """
SELECT tenant_id, scope, key, created_at, recovery_point, expires_at <= now(), count(*) OVER ()
  FROM idempotency_keys
 WHERE state = 'pending' AND created_at < now() - %s
   AND (locked_until IS NULL OR locked_until <= clock_timestamp())
 ORDER BY created_at
 LIMIT %s
"""


@dataclass(frozen=True)
class StuckKey:
    """A pending key nothing is working on.

    ``completable``: the completer will finish it (its program opted in);
    otherwise only the client's retry can, and after ``expired`` a human
    should look: the request may be half done (e.g. charged, no receipt).
    """

    tenant_id: int
    scope: str
    key: str
    created_at: datetime
    recovery_point: str
    expired: bool
    completable: bool


@dataclass
class ReapReport:
    deleted: int = 0
    batches: int = 0
    tenants: int = 0
    dry_run: bool = False
    skipped: bool = False  # another reaper held the lock
    seconds: float = 0.0
    longest_batch_seconds: float = 0.0  # the longest delete transaction (its locks' lifetime)
    stuck_count: int = 0
    stuck: list[StuckKey] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["stuck"] = [{**asdict(s), "created_at": s.created_at.isoformat()} for s in self.stuck]
        return data


def ensure_cross_tenant(alias: str, table: str) -> None:
    """Refuse to run cross-tenant upkeep on an alias that RLS confines to one tenant."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT current_user, row_security_active(%s::regclass)", [table])
        role, confined = cursor.fetchone()
    if confined:
        raise ReaperRefused(
            f"Database alias {alias!r} connects as {role!r}, which is subject to row-level "
            f"security on {table}: it cannot see other tenants' rows. Use the system role "
            '(TENANCY["SYSTEM_DATABASE"], docs/roles.md).'
        )


def reap_expired_keys(
    *,
    batch_size: int | None = None,
    pause: float | None = None,
    dry_run: bool = False,
    using: str | None = None,
    progress: Callable[[str], None] | None = None,
    stuck_sample: int = 20,
) -> ReapReport:
    """Delete the expired keys of every tenant, in batches; report stuck keys.

    Args:
        batch_size: rows per delete transaction; ``REAP_BATCH_SIZE`` by default.
        pause: seconds between two batches; ``REAP_PAUSE`` by default.
        dry_run: count what would be deleted, delete nothing.
        using: database alias; ``TENANCY["SYSTEM_DATABASE"]`` by default.
        progress: called with a line after each batch (commands print it).
        stuck_sample: how many stuck keys to list in the report.

    Returns:
        A :class:`ReapReport`; ``skipped`` is true when another reaper was running.

    Raises:
        ReaperRefused: the alias's role is subject to RLS on the keys table.
        ConfigurationError: the alias does not exist.
    """
    started = time.monotonic()
    alias = system_alias(using)
    size = int(batch_size or idempotency_settings.REAP_BATCH_SIZE)
    pause = float(idempotency_settings.REAP_PAUSE if pause is None else pause)
    if size < 1:
        raise ValueError(f"batch size must be at least 1, not {size}")
    connection = connections[alias]
    if connection.in_atomic_block:
        raise RuntimeError("reap_expired_keys() commits each batch: call it outside atomic().")
    require_cross_tenant(alias, ["idempotency_keys"], job="the key reaper")
    report = ReapReport(dry_run=dry_run)

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [REAP_LOCK_ID])
        if not cursor.fetchone()[0]:
            report.skipped = True
            return report
    try:
        for tenant_id in tenants_with_rows(alias, "idempotency_keys"):
            deleted = _reap_tenant(alias, tenant_id, size, pause, dry_run, report, progress)
            report.tenants += 1 if deleted else 0
        _find_stuck(alias, report, stuck_sample)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [REAP_LOCK_ID])
    report.seconds = time.monotonic() - started
    return report


def _reap_tenant(
    alias: str,
    tenant_id: int,
    size: int,
    pause: float,
    dry_run: bool,
    report: ReapReport,
    progress: Callable[[str], None] | None,
) -> int:
    total = 0
    if dry_run:
        with connections[alias].cursor() as cursor:
            cursor.execute(_COUNT_EXPIRED, [tenant_id])
            total = cursor.fetchone()[0]
        report.deleted += total
        return total
    while True:
        if report.batches and pause:
            time.sleep(pause)  # leave the server to live traffic between batches
        started = time.monotonic()
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            # A batch lost in a crash is simply deleted again by the next run,
            # so its commit need not wait for the WAL flush (nor make others wait).
            cursor.execute("SET LOCAL synchronous_commit = off")
            cursor.execute(_DELETE_BATCH, [tenant_id, size])
            deleted = cursor.rowcount
        elapsed = time.monotonic() - started
        report.longest_batch_seconds = max(report.longest_batch_seconds, elapsed)
        if deleted == 0:
            return total
        total += deleted
        report.deleted += deleted
        report.batches += 1
        if progress:
            progress(f"tenant {tenant_id}: deleted {deleted} (total {report.deleted})")
        if deleted < size:
            return total


def _find_stuck(alias: str, report: ReapReport, sample: int) -> None:
    after = idempotency_settings.STUCK_AFTER
    with connections[alias].cursor() as cursor:
        cursor.execute(_STUCK, [after, sample])  # type: ignore[list-item]
        rows = cursor.fetchall()
    from idempotency.phases import completable_scopes

    completable = set(completable_scopes())
    report.stuck = [
        StuckKey(
            tenant_id=row[0], scope=row[1], key=row[2], created_at=row[3],
            recovery_point=row[4], expired=row[5], completable=row[1] in completable,
        )
        for row in rows
    ]
    report.stuck_count = rows[0][6] if rows else 0
