"""Parked messages: listing them and handling them again ("re-driving").

A consumer parks a message after its ``max_attempts`` failures, so the rest of
its partition keeps flowing; a Celery receiver parks one after
``RECEIVER_MAX_ATTEMPTS`` (its rows are named ``celery:<task name>``). The
dead-letter row is a full copy of the message. Re-driving runs the consumer's
``handle`` (or the receiver task's body, in this process, with its
de-duplication) again as the message's tenant and deletes the row in the same
transaction: a re-driven message has its database effects exactly once, like
any other. Re-driven messages are, by nature, out of order with the rest of
their key.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.db import transaction

from outbox import store
from outbox.consumers import Consumer, configured_consumers
from outbox.exceptions import ConsumerConfigError
from outbox.store import Parked
from outbox.stream import Message
from tenancy import tenant_context
from tenancy.aliases import app_alias, system_alias

logger = logging.getLogger("outbox")


def list_parked(
    consumer: str | None = None, tenant_id: int | None = None, limit: int = 100
) -> list[Parked]:
    """Parked messages across tenants (read on the system alias), oldest first."""
    return store.list_parked(system_alias(), consumer, tenant_id, limit)


@dataclass(frozen=True)
class RedriveResult:
    handled: int
    failed: int
    missing: int


def redrive(
    consumer: str | None = None,
    ids: Sequence[tuple[int, int]] | None = None,
    *,
    tenant_id: int | None = None,
) -> RedriveResult:
    """Handle parked messages again; delete each one whose handler succeeds.

    Args:
        consumer: only this consumer's parked messages.
        ids: only these ``(tenant_id, id)`` dead-letter rows.
        tenant_id: only this tenant's.

    Each message is its own transaction on the app alias, as its tenant. A
    handler that fails again leaves the row parked, with the attempt counted
    and the new error. A row being re-driven by someone else is skipped.

    Raises:
        ConsumerConfigError: a row names a consumer that is not configured.
    """
    consumers = {c.name: c for c in configured_consumers()}
    if consumer is not None and consumer not in consumers and not _is_receiver(consumer):
        raise ConsumerConfigError(f"unknown consumer {consumer!r}")
    if ids is None:
        rows = [(p.tenant_id, p.id) for p in list_parked(consumer, tenant_id, limit=10**9)]
    else:
        rows = list(ids)
    handled = failed = missing = 0
    for tenant, row_id in rows:
        outcome = _redrive_one(consumers, tenant, row_id, consumer)
        handled += outcome == "handled"
        failed += outcome == "failed"
        missing += outcome == "missing"
    return RedriveResult(handled, failed, missing)


def _redrive_one(
    consumers: dict[str, Consumer], tenant: int, row_id: int, only: str | None
) -> str:
    alias = app_alias()
    with tenant_context(tenant, using=alias):
        parked = store.lock_parked(alias, tenant, row_id)
        if parked is None or (only is not None and parked.consumer != only):
            return "missing"
        name = parked.consumer
        handle = _receiver_handler(name, tenant, row_id) if _is_receiver(name) else None
        if handle is None and name not in consumers:
            raise ConsumerConfigError(
                f"parked message {tenant}/{row_id} belongs to consumer {name!r}, which is not "
                'in OUTBOX["CONSUMERS"]'
            )
        try:
            with transaction.atomic(using=alias):
                (handle or consumers[name].handle)(parked.message)
        except Exception as exc:
            logger.warning("outbox: re-driving %s/%s for %s failed again: %s",
                           tenant, row_id, name, exc)
            error = "".join(traceback.format_exception(exc)).strip()
            store.record_redrive_failure(alias, tenant, row_id, error)
            return "failed"
        store.delete_parked(alias, tenant, row_id)
        return "handled"


def _is_receiver(name: str) -> bool:
    return name.startswith(("celery:", "tasks:"))


def _receiver_handler(name: str, tenant: int, row_id: int) -> Callable[[Message], object]:
    """Runs the receiver task's body on a parked message, in this process."""
    if name.startswith("tasks:"):  # a receiver on Django's Tasks framework
        from outbox.django_tasks import redrive_handler

        handle = redrive_handler(name)
        if handle is None:
            raise ConsumerConfigError(
                f"parked message {tenant}/{row_id} belongs to {name!r}, which does not name a "
                "Django task made by outbox.django_tasks.receiver_task")
        return handle
    from outbox.celery import DEAD_LETTER_PREFIX, receiver_body

    task_name = name.removeprefix(DEAD_LETTER_PREFIX)
    body = receiver_body(task_name)
    if body is None:
        raise ConsumerConfigError(
            f"parked message {tenant}/{row_id} belongs to Celery task {task_name!r}, which the "
            'Celery app (OUTBOX["CELERY_APP"]) does not have as an outbox receiver'
        )
    # The Message itself, not its envelope: it comes from the dead-letter
    # table, where only a message that passed its receiver's checks is parked.
    return body


def discard(ids: Sequence[tuple[int, int]]) -> int:
    """Delete dead-letter rows ``(tenant_id, id)`` without handling them; return how many.

    Each tenant's rows are deleted as that tenant, on the app alias (under
    row-level security), in one transaction per tenant.
    """
    alias = app_alias()
    by_tenant: dict[int, list[tuple[int, int]]] = {}
    for tenant, row_id in ids:
        by_tenant.setdefault(tenant, []).append((tenant, row_id))
    deleted = 0
    for tenant, rows in sorted(by_tenant.items()):
        with tenant_context(tenant, using=alias):
            deleted += store.discard_parked(alias, rows)
    if deleted:
        logger.warning("outbox: discarded %d parked message(s) unhandled", deleted)
    return deleted
