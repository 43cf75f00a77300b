"""Deleting old messages, never one that a reader has not passed.

A message goes once older than ``OUTBOX["RETENTION"]`` and at or below every
reader's floor (:attr:`outbox.stream.Position.floor`): every row of
``consumer_offsets`` and every configured consumer or relay without one yet
(it will start from the beginning). A retired consumer's offset rows must be
deleted, or it holds retention back. With ``OUTBOX["REPLICATION_SLOT"]``, the
slot is a reader too (:attr:`outbox.debezium.SlotState.passed_before`; while it
does not exist, nothing goes). Receiver records go after ``RETENTION`` as well:
a message can be sent again only while it is kept. Bounded batches on the
system alias, one short transaction each.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from outbox import debezium, metrics, store
from outbox.conf import outbox_settings
from outbox.consumers import configured_consumers
from outbox.relay import relay_readers
from tenancy.aliases import system_alias
from tenancy.db import require_cross_tenant, tenants_with_rows

logger = logging.getLogger("outbox")

#: Rows deleted per transaction (``reap_outbox --batch-size``).
BATCH_SIZE = 5000

#: The largest message id: no reader's position limits retention.
_NO_LIMIT = 2**63 - 1


@dataclass(frozen=True)
class ReapResult:
    messages: int
    received: int
    horizon: int | None
    #: With a replication slot: the transaction id below which it has passed
    #: every transaction (None: the slot does not exist).
    slot_horizon: int | None = None


def horizon(using: str | None = None) -> int | None:
    """The lowest reader position: messages strictly below it were passed by all.

    None when some configured reader has no offset row yet (nothing may be
    deleted) or when there are no readers at all.
    """
    return _floor(system_alias(using), alone=None)


def _floor(alias: str, *, alone: int | None) -> int | None:
    """:func:`horizon`, but ``alone`` when there are no readers at all."""
    expected = {(c.name, p) for c in configured_consumers() for p in range(c.partitions)}
    readers = store.reader_positions(alias)
    if outbox_settings.TRANSPORT is not None:
        expected.update((name, 0) for name in relay_readers(r.name for r in readers))
    present = {(r.name, r.partition) for r in readers}
    if expected - present:
        return None
    if not readers:
        return alone
    return min(r.position.floor for r in readers)


def reap(batch_size: int | None = None, using: str | None = None) -> ReapResult:
    """Delete expired, passed messages and old receiver records; return the counts.

    Raises:
        CrossTenantRefused: the alias is subject to row-level security
            (it would see, and delete, at most one tenant's rows).
    """
    alias = system_alias(using)
    size = batch_size or BATCH_SIZE
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"batch size must be a positive int, not {size!r}")
    require_cross_tenant(alias, ["outbox_messages", "outbox_received"], job="reap_outbox")
    retention = outbox_settings.RETENTION
    slot = None
    if outbox_settings.REPLICATION_SLOT is None:
        limit = _floor(alias, alone=None)
    else:
        # The slot is the one reader when no consumer or relay is configured.
        limit = _floor(alias, alone=_NO_LIMIT)
        state = debezium.slot_state(alias)
        slot = None if state is None else state.passed_before
        if slot is None:
            limit = None
    messages = 0
    if limit is not None:
        # Strictly below the lowest position is "<=" the position itself: the
        # reader has passed the message it points at.
        while True:
            if slot is None:
                deleted = store.delete_passed_messages(alias, limit, retention, size)
            else:
                deleted = debezium.delete_passed_messages(alias, limit, slot, retention, size)
            messages += deleted
            if deleted < size:
                break
    received = 0
    for tenant_id in tenants_with_rows(alias, "outbox_received"):
        while True:
            deleted = store.delete_received(alias, tenant_id, retention, size)
            received += deleted
            if deleted < size:
                break
    logger.info("outbox: reaped %d message(s) and %d receiver record(s)", messages, received)
    metrics.upkeep("reap_outbox", messages + received)
    return ReapResult(messages, received, limit, slot)
