"""``publish()``: write an event in the caller's transaction."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from django.db import connections
from django.utils.module_loading import import_string

from django_idempotency_outbox import tracing
from outbox import debezium, metrics, store
from outbox.conf import outbox_settings
from outbox.exceptions import NoTenant, NotInTransaction
from tenancy.aliases import tenant_alias
from tenancy.context import tenant_of

logger = logging.getLogger("outbox")

#: Set after a commit that published; relays running in this process wait on it.
wake_up = threading.Event()


def publish(
    topic: str,
    payload: Any,
    *,
    key: str | None = None,
    aggregate_type: str | None = None,
    aggregate_id: str | int | None = None,
    headers: Mapping[str, Any] | None = None,
    message_id: uuid.UUID | None = None,
    using: str | None = None,
) -> uuid.UUID:
    """Record an event in the current transaction; it is delivered after COMMIT.

    The message commits or rolls back with the caller's writes: a rolled-back
    order never announces itself, and a committed one always does. That is
    the whole point, so calling this outside ``transaction.atomic()`` raises
    instead of committing the message on its own.

    Example::

        with tenant_context(42):           # opens the transaction
            order = Order.objects.create(...)
            publish("order.created", {"id": order.pk}, key=f"order:{order.pk}")

    Args:
        topic: what happened, e.g. ``"order.created"``; consumers and the
            Celery transport select by it.
        payload: JSON-serialisable data (dates, decimals and UUIDs are
            encoded as by Django's JSON encoder).
        key: the ordering key: messages with the same key reach each consumer
            partition in order. Usually the aggregate, e.g. ``"order:71001"``.
        aggregate_type, aggregate_id: the entity the event is about (the
            columns Debezium's outbox router calls by these names).
        headers: extra JSON-serialisable metadata (trace ids and the like).
        message_id: the message's UUID; a new random one when omitted.
        using: database alias; when omitted, ``TENANCY["APP_DATABASE"]`` (the
            worker alias inside a consumer's batch, ``tenancy.aliases.tenant_alias``).

    Returns:
        The message id, which receivers use to de-duplicate.

    Raises:
        NotInTransaction: not inside ``transaction.atomic()``.
        NoTenant: no :func:`tenancy.tenant_context` is open.
        TypeError: the payload or headers are not JSON-serialisable.
    """
    alias = tenant_alias(using)
    connection = connections[alias]
    if not connection.in_atomic_block:
        raise NotInTransaction(
            f"outbox.publish({topic!r}) must run inside transaction.atomic() (or "
            "tenant_context()): the message has to commit with the change it announces."
        )
    tenant_id = tenant_of(connection)
    if tenant_id is None:
        raise NoTenant(
            f"outbox.publish({topic!r}) needs a tenant: call it inside tenant_context(tenant_id)."
        )
    if not isinstance(topic, str) or not 0 < len(topic) <= 200:
        raise ValueError("outbox.publish(): topic must be a string of 1 to 200 characters")
    aggregate = None if aggregate_id is None else str(aggregate_id)
    for name, value in (("key", key), ("aggregate_type", aggregate_type),
                        ("aggregate_id", aggregate)):
        if value is not None and len(str(value)) > 200:
            raise ValueError(f"outbox.publish(): {name} is longer than 200 characters")
    message_id = message_id or uuid.uuid4()
    fields = {"tenant_id": tenant_id, "message_id": message_id, "topic": topic, "key": key,
              "aggregate_type": aggregate_type, "aggregate_id": aggregate, "payload": payload}
    # Signed here when Debezium carries the messages (no relay signs them).
    signed = debezium.signed_headers(fields, tracing.inject(dict(headers or {})))
    store.insert_message(alias, fields, signed)
    if not any(entry[1] is _kick for entry in connection.run_on_commit):
        # One wake-up per transaction, however many messages it publishes.
        # Django drops the hooks of a rolled-back transaction or savepoint, so
        # looking for ours among the pending hooks is always accurate. Django
        # has no public way to ask; its pending hooks are (savepoint ids,
        # callable, robust) tuples, which tests/outbox/test_upstream.py pins.
        connection.on_commit(_kick)
    counters = metrics.instruments()
    if counters is not None:
        # Counted when it commits: a rolled-back savepoint drops the hook.
        connection.on_commit(counters.published_count(topic))
    return message_id


def _kick() -> None:
    wake_up.set()
    hook = outbox_settings.ON_COMMIT
    if hook:
        try:
            (import_string(hook) if isinstance(hook, str) else hook)()
        except Exception:  # the messages are committed; polling will find them
            logger.exception("outbox: the ON_COMMIT wake-up hook failed")
