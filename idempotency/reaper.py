"""Deleting expired idempotency keys of every tenant.

On the system alias: tenant by tenant, expired finished keys in bounded
batches, one short transaction each, skipping rows a live request has
locked. Pending keys are never deleted: they are reported, and given up on
once untouched for ``GIVE_UP_AFTER`` (finished with the abandoned answer,
deleted after their TTL), so no key stays pending forever. One reaper runs
at a time, under a lease row renewed before each batch (a row, not a session
lock, so that it holds behind a transaction pooler); a second one raises
:class:`~idempotency.exceptions.ReaperBusy`. docs/commands.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from django.db import connections

from idempotency import metrics, store
from idempotency.conf import (
    REAP_BATCH_SIZE,
    REAP_LEASE,
    REAP_PAUSE,
    STUCK_AFTER,
    idempotency_settings,
)
from idempotency.exceptions import ReaperBusy
from idempotency.store import GivenUp, StuckRow
from tenancy.aliases import system_alias
from tenancy.db import require_cross_tenant, tenants_with_rows
from tenancy.exceptions import CrossTenantRefused

logger = logging.getLogger("idempotency")

#: The reaper's refusal of an RLS-bound alias (the library's one cross-tenant error).
ReaperRefused = CrossTenantRefused


@dataclass
class ReapReport:
    deleted: int = 0
    batches: int = 0
    tenants: int = 0
    dry_run: bool = False
    seconds: float = 0.0
    longest_batch_seconds: float = 0.0  # the longest delete transaction (its locks' lifetime)
    stuck_count: int = 0
    # Pending keys nothing works on (the first ``stuck_sample``), and the scopes
    # whose program the completer will finish: a stuck key of another scope
    # waits for its client's retry, or, once expired, for a human.
    stuck: list[StuckRow] = field(default_factory=list)
    completable: frozenset[str] = frozenset()
    gave_up: int = 0  # pending keys untouched for GIVE_UP_AFTER, finished as abandoned
    given_up: list[GivenUp] = field(default_factory=list)  # the first of them

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["stuck"] = [{**asdict(s), "created_at": s.created_at.isoformat(),
                          "completable": s.scope in self.completable} for s in self.stuck]
        data["completable"] = sorted(self.completable)
        return data


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
        batch_size: rows per delete transaction; 100 by default.
        pause: seconds between two batches; 0.01 by default.
        dry_run: count what would be deleted, delete nothing.
        using: database alias; ``TENANCY["SYSTEM_DATABASE"]`` by default.
        progress: called with a line after each batch (commands print it).
        stuck_sample: how many stuck keys to list in the report.

    Returns:
        A :class:`ReapReport`.

    Raises:
        ReaperBusy: another reaper holds the lease (nothing was done), or this
            one lost it between two batches (it stopped there).
        ReaperRefused: the alias's role is subject to RLS on the keys table.
        ConfigurationError: the alias does not exist.
    """
    started = time.monotonic()
    alias = system_alias(using)
    size = int(batch_size or REAP_BATCH_SIZE)
    pause = float(REAP_PAUSE if pause is None else pause)
    if size < 1:
        raise ValueError(f"batch size must be at least 1, not {size}")
    if connections[alias].in_atomic_block:
        raise RuntimeError("reap_expired_keys() commits each batch: call it outside atomic().")
    require_cross_tenant(alias, ["idempotency_keys"], job="the key reaper")
    report = ReapReport(dry_run=dry_run)

    lease = _Lease(alias)
    lease.renew()
    try:
        _give_up(alias, size, dry_run, report, stuck_sample)
        for tenant_id in tenants_with_rows(alias, "idempotency_keys"):
            deleted = _reap_tenant(
                alias, tenant_id, size, pause, dry_run, report, progress, lease
            )
            report.tenants += 1 if deleted else 0
        _find_stuck(alias, report, stuck_sample)
    finally:
        lease.release()
    report.seconds = time.monotonic() - started
    if not dry_run:
        metrics.upkeep("reap_keys", report.deleted + report.gave_up)
    return report


class _Lease:
    """The reaper's lease: claimed at the start and renewed before every batch."""

    def __init__(self, alias: str) -> None:
        self.lease = store.reaper_lease(alias)
        self.held = False

    def renew(self) -> None:
        if self.lease.claim(REAP_LEASE) is not None:
            self.held = True
            return
        owner, until = self.lease.holder() or ("?", None)
        what = "lost its lease to" if self.held else "not run:"
        self.held = False
        raise ReaperBusy(
            f"reaper {what} another reaper ({owner}) holds the lease until "
            f"{until.isoformat(timespec='seconds') if until else '?'}"
        )

    def release(self) -> None:
        if self.held:
            self.lease.release()
            self.held = False


def _reap_tenant(
    alias: str,
    tenant_id: int,
    size: int,
    pause: float,
    dry_run: bool,
    report: ReapReport,
    progress: Callable[[str], None] | None,
    lease: _Lease,
) -> int:
    total = 0
    if dry_run:
        total = store.count_expired(alias, tenant_id)
        report.deleted += total
        return total
    while True:
        if report.batches and pause:
            time.sleep(pause)  # leave the server to live traffic between batches
        lease.renew()
        started = time.monotonic()
        deleted = store.delete_expired_batch(alias, tenant_id, size)
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


def _give_up(alias: str, size: int, dry_run: bool, report: ReapReport, sample: int) -> None:
    from idempotency.phases import abandoned_answer

    after = idempotency_settings.GIVE_UP_AFTER
    if dry_run:
        report.gave_up = store.count_untouched(alias, after)
        return
    answer = abandoned_answer()
    while True:
        batch = store.give_up_untouched(alias, after, size, answer, idempotency_settings.TTL)
        for given in batch:
            logger.error(
                "reaper: gave up on %s/%s/%s at recovery point %s, untouched for %s; it now "
                "answers %d (idempotency_request_abandoned): check what of it took effect",
                given.tenant_id, given.scope, given.key, given.recovery_point, after,
                answer.status_code,
            )
        report.gave_up += len(batch)
        report.given_up.extend(batch[: max(0, sample - len(report.given_up))])
        if len(batch) < size:
            return


def _find_stuck(alias: str, report: ReapReport, sample: int) -> None:
    from idempotency.phases import completable_scopes

    report.stuck, report.stuck_count = store.stuck_keys(alias, STUCK_AFTER, sample)
    report.completable = frozenset(completable_scopes())
