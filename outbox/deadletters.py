"""Parked messages: listing them and handling them again ("re-driving").

A consumer parks a message after ``MAX_ATTEMPTS`` failures, so the rest of
its partition keeps flowing. The dead-letter row is a full copy of the
message. Re-driving runs the consumer's ``handle`` again as the message's
tenant and deletes the row in the same transaction: a re-driven message has
its database effects exactly once, like any other. Re-driven messages are, by
nature, out of order with the rest of their key.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, transaction

from outbox.consumers import Consumer, ConsumerConfigError, configured_consumers
from outbox.stream import Message
from tenancy import tenant_context
from tenancy.aliases import app_alias, system_alias

logger = logging.getLogger("outbox")


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


def list_parked(
    consumer: str | None = None, tenant_id: int | None = None, limit: int = 100
) -> list[Parked]:
    """Parked messages across tenants (read on the system alias), oldest first."""
    where: list[str] = ["TRUE"]
    params: list[str | int] = []
    if consumer is not None:
        where.append("consumer = %s")
        params.append(consumer)
    if tenant_id is not None:
        where.append("tenant_id = %s")
        params.append(tenant_id)
    params.append(limit)
    with connections[system_alias()].cursor() as cursor:
        cursor.execute(
            "SELECT tenant_id, id, consumer, message_id::text, topic, key, attempts, parked_at,"
            " error FROM outbox_dead_letters"
            f" WHERE {' AND '.join(where)} ORDER BY parked_at, tenant_id, id LIMIT %s",
            params,
        )
        return [Parked(*row) for row in cursor.fetchall()]


def count_parked() -> dict[str, int]:
    """Parked messages per consumer, across tenants."""
    with connections[system_alias()].cursor() as cursor:
        cursor.execute("SELECT consumer, count(*) FROM outbox_dead_letters GROUP BY consumer")
        return dict(cursor.fetchall())


@dataclass(frozen=True)
class RedriveResult:
    handled: int
    failed: int
    missing: int


_LOCK_ROW = """
SELECT consumer, message_pk, message_id, topic, key, aggregate_type, aggregate_id,
       payload, headers, message_created_at
  FROM outbox_dead_letters
 WHERE tenant_id = %s AND id = %s
   FOR UPDATE SKIP LOCKED
"""


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
    if consumer is not None and consumer not in consumers:
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
        with connections[alias].cursor() as cursor:
            cursor.execute(_LOCK_ROW, [tenant, row_id])
            row = cursor.fetchone()
        if row is None or (only is not None and row[0] != only):
            return "missing"
        name = row[0]
        if name not in consumers:
            raise ConsumerConfigError(
                f"parked message {tenant}/{row_id} belongs to consumer {name!r}, which is not "
                'in OUTBOX["CONSUMERS"]'
            )
        message = Message(
            id=row[1], message_id=row[2], tenant_id=tenant, topic=row[3], key=row[4],
            aggregate_type=row[5], aggregate_id=row[6], payload=_json(row[7]),
            headers=_json(row[8]) or {}, created_at=row[9],
        )
        try:
            with transaction.atomic(using=alias):
                consumers[name].handle(message)
        except Exception as exc:
            logger.warning("outbox: re-driving %s/%s for %s failed again: %s",
                           tenant, row_id, name, exc)
            with connections[alias].cursor() as cursor:
                cursor.execute(
                    "UPDATE outbox_dead_letters SET attempts = attempts + 1, error = %s,"
                    " parked_at = now() WHERE tenant_id = %s AND id = %s",
                    ["".join(traceback.format_exception(exc)).strip(), tenant, row_id],
                )
            return "failed"
        with connections[alias].cursor() as cursor:
            cursor.execute(
                "DELETE FROM outbox_dead_letters WHERE tenant_id = %s AND id = %s",
                [tenant, row_id],
            )
        return "handled"


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value
