"""In-database consumers: exactly-once database effects per message (docs/consumers.md).

A batch is one transaction on the worker alias: it locks the partition's
offset row (``SKIP LOCKED``: another worker has it), reads the next messages
on the system alias, runs ``handle`` as each message's tenant (the handler's
ORM writes are routed to the same transaction) and advances the offset, so the
writes and the advance commit or roll back together. A handler that raises is
rolled back to its savepoint and its message retried after a growing pause,
then parked; its error is kept in its tenant's row of
``outbox_consumer_failures``, never on the shared offset row.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any, ClassVar

from django.db import OperationalError, connections, transaction
from django.utils.module_loading import import_string

from django_idempotency_outbox import tracing
from django_idempotency_outbox.durations import backoff
from outbox import metrics, store
from outbox.conf import outbox_settings
from outbox.exceptions import ConsumerConfigError
from outbox.store import HeadFailure
from outbox.stream import Message
from tenancy import tenant_context
from tenancy.aliases import system_alias, worker_alias, working_as_worker
from tenancy.db import require_cross_tenant

logger = logging.getLogger("outbox")


class Consumer:
    """Subclass to handle outbox messages inside the database.

    Example::

        class ShippingProjection(Consumer):
            name = "shipping"
            topics = ["order.created", "order.cancelled"]
            partitions = 4

            def handle(self, message):
                Shipment.objects.update_or_create(
                    tenant_id=message.tenant_id,
                    order_id=message.payload["id"],
                    defaults={"state": message.topic},
                )

    and list it in ``OUTBOX["CONSUMERS"]``; ``manage.py run_consumers`` runs it.

    ``handle`` runs inside the message's tenant context, in the same
    transaction as the offset advance: its database writes happen exactly once
    per message. It may be called more than once for a message (after a crash,
    or when another message of its batch fails), so effects outside the
    database must be idempotent. Raising makes the message retried; its writes
    are rolled back.

    Attributes:
        name: unique and stable: the offset rows are keyed by it. Renaming a
            consumer starts it again from the beginning of the outbox.
        topics: topics to handle; None handles every topic.
        partitions: how many workers may share the consumer. Messages with one
            key always fall into one partition and are handled in order.
            Changing it needs the consumer's offsets reset (see docs/consumers.md).
        batch_size: messages per batch (one transaction).
        max_attempts: attempts at one message before it is parked in the
            dead-letter table, so that the stream keeps flowing.
        retry_backoff, retry_backoff_max: seconds before the second attempt
            at a failing message, doubled for each further one up to the
            second. Its partition waits meanwhile.
        lost_after: during a batch, the server ends the session of a consumer
            whose host stopped answering after about this many seconds (TCP
            keepalives and ``tcp_user_timeout``, set for the batch's
            transaction only), which releases its partition; 0 leaves the
            server's settings alone (docs/consumers.md, "Workers that vanish").
        max_rate: messages a second each partition handles at most in one
            ``run_consumers`` process, None for as many as it can: a consumer
            catching up on a long backlog then leaves the machine to the
            consumers that are keeping up (docs/scaling.md). A batch runs when
            the one before it has been paid for at this rate; other consumers
            of the process run meanwhile. Processes that share the consumer
            pace themselves each.
    """

    name: ClassVar[str] = ""
    topics: ClassVar[Sequence[str] | None] = None
    partitions: ClassVar[int] = 1
    batch_size: ClassVar[int] = 500
    max_attempts: ClassVar[int] = 5
    retry_backoff: ClassVar[float] = 1.0
    retry_backoff_max: ClassVar[float] = 300.0
    lost_after: ClassVar[float] = 3.0
    max_rate: ClassVar[float | None] = None

    def handle(self, message: Message) -> None:
        raise NotImplementedError(f"{type(self).__name__}.handle() is not implemented")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def validate(consumer: Consumer) -> Consumer:
    cls = type(consumer)
    if not isinstance(consumer.name, str) or not consumer.name.strip():
        raise ConsumerConfigError(f"{cls.__qualname__} has no name")
    if consumer.name.startswith("relay:"):
        raise ConsumerConfigError(f"consumer name {consumer.name!r}: 'relay:' is reserved")
    if len(consumer.name) > 200:
        raise ConsumerConfigError(f"consumer name {consumer.name[:40]!r}... is over 200 chars")
    if isinstance(consumer.partitions, bool) or not isinstance(consumer.partitions, int) or (
        consumer.partitions < 1
    ):
        raise ConsumerConfigError(f"{consumer.name}: partitions must be an int >= 1")
    for attribute in ("batch_size", "max_attempts"):
        value = getattr(consumer, attribute)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConsumerConfigError(f"{consumer.name}: {attribute} must be an int >= 1, "
                                      f"not {value!r}")
    for attribute in ("retry_backoff", "retry_backoff_max", "lost_after"):
        value = getattr(consumer, attribute)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise ConsumerConfigError(f"{consumer.name}: {attribute} must be a number of "
                                      f"seconds, 0 or more, not {value!r}")
    rate = consumer.max_rate
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                             or not 0 < rate < float("inf")):
        raise ConsumerConfigError(f"{consumer.name}: max_rate must be a number of messages a "
                                  f"second above 0, or None, not {rate!r}")
    if consumer.topics is not None and (
        isinstance(consumer.topics, str) or not all(isinstance(t, str) for t in consumer.topics)
    ):
        raise ConsumerConfigError(f"{consumer.name}: topics must be a list of strings or None")
    return consumer


def configured_consumers() -> list[Consumer]:
    """Instances of the classes listed in ``OUTBOX["CONSUMERS"]``."""
    consumers: list[Consumer] = []
    for entry in outbox_settings.CONSUMERS:
        try:
            obj = import_string(entry) if isinstance(entry, str) else entry
        except ImportError as exc:
            raise ConsumerConfigError(
                f'OUTBOX["CONSUMERS"]: cannot import {entry!r}: {exc}'
            ) from exc
        consumer = obj() if isinstance(obj, type) else obj
        if not isinstance(consumer, Consumer):
            raise ConsumerConfigError(f'OUTBOX["CONSUMERS"]: {entry!r} is not an outbox.Consumer')
        consumers.append(validate(consumer))
    names = [c.name for c in consumers]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConsumerConfigError(f'OUTBOX["CONSUMERS"]: duplicate names {duplicates}')
    return consumers


def select_consumers(names: Iterable[str] = ()) -> list[Consumer]:
    """The configured consumers named in ``names`` (all of them when empty)."""
    consumers = configured_consumers()
    wanted = list(names)
    if not wanted:
        return consumers
    by_name = {c.name: c for c in consumers}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        known = ", ".join(sorted(by_name)) or "none"
        raise ConsumerConfigError(f"unknown consumer(s) {', '.join(unknown)} (configured: {known})")
    return [by_name[n] for n in wanted]


def require_cross_tenant_reader(alias: str) -> None:
    """Refuse a reading alias that row-level security applies to.

    Such a role would see no message (or one tenant's), and the readers would
    wait forever or, worse, move their offsets past messages they never saw.
    """
    require_cross_tenant(alias, ["outbox_messages"], job="reading the outbox")


def ensure_offsets(consumer: Consumer, using: str | None = None) -> None:
    """Create the consumer's offset rows (at the start of the outbox) if missing.

    Raises:
        ConsumerConfigError: the rows exist with another partition count; the
            partitions would no longer match the messages they have passed.
    """
    alias = worker_alias(using)
    counts = store.partition_counts(alias, consumer.name)
    if counts and counts != {consumer.partitions}:
        raise ConsumerConfigError(
            f"consumer {consumer.name!r} has {consumer.partitions} partition(s) but its "
            f"offsets were made with {sorted(counts)}; see docs/consumers.md, "
            "'Changing the number of partitions'."
        )
    store.create_offsets(alias, consumer.name, consumer.partitions)


@dataclass(frozen=True)
class BatchResult:
    """What one batch did.

    Attributes:
        handled: messages whose effects were committed.
        locked: another worker holds this partition; nothing was done.
        waiting: the head message is waiting for its next attempt.
        failed: a message raised (and will be retried, or was parked).
        parked: that message was moved to the dead-letter table.
        full: the batch was full, so more messages may be ready at once.
    """

    handled: int = 0
    locked: bool = False
    waiting: bool = False
    failed: bool = False
    parked: bool = False
    full: bool = False


def run_batch(consumer: Consumer, partition: int = 0) -> BatchResult:
    """Handle the next batch of one consumer partition, in one transaction.

    The transaction is on the worker alias; tenant work inside it (the
    handlers' ``tenant_context()``, ``publish()`` and routed ORM queries)
    runs there too (:func:`tenancy.aliases.working_as_worker`).

    Returns at once with ``locked=True`` when another worker holds the
    partition, and with ``waiting=True`` while a failed head message waits
    for its next attempt.
    """
    worker = worker_alias()
    with working_as_worker(worker):
        result = _run_batch(consumer, partition, worker, system_alias())
    # Counted once the batch's transaction committed.
    metrics.consumed(consumer.name, result.handled)
    if result.parked:
        metrics.parked(consumer.name)
    return result


def _run_batch(consumer: Consumer, partition: int, worker: str, system: str) -> BatchResult:
    from outbox.models import ConsumerFailure  # Consumer is importable before the app registry

    max_attempts = consumer.max_attempts
    with transaction.atomic(using=worker):
        offset = store.lock_offset(worker, consumer.name, partition, lost_after=consumer.lost_after)
        if offset is None:
            return BatchResult(locked=True)
        if offset.waiting:
            return BatchResult(waiting=True)
        batch = store.read_batch(system, offset.position, consumer.batch_size,
                                 topics=consumer.topics, partition=partition,
                                 partition_count=consumer.partitions)
        messages = batch.messages
        if not messages:
            moved = batch.position_after(offset.position)
            if offset.stale and moved != offset.position:
                store.advance_offset(worker, consumer.name, partition, moved)
            return BatchResult()
        done, failure = _handle(consumer, messages, worker)
        head_passes = done > 0 or failure is None or offset.attempts + 1 >= max_attempts
        if offset.attempts and head_passes:
            # The head had failed before and is now handled or parked: its
            # error (its tenant's row) goes. (Failing again, it is replaced.)
            with tenant_context(messages[0].tenant_id, using=worker):
                ConsumerFailure.objects.using(worker).filter(
                    consumer=consumer.name, partition=partition).delete()
        if failure is None:
            position = batch.position_after(offset.position)
            store.advance_offset(worker, consumer.name, partition, position)
            return BatchResult(handled=done, full=not batch.complete)

        message, exc = failure
        attempts = (offset.attempts if done == 0 else 0) + 1
        error = "".join(traceback.format_exception(exc)).strip()
        if attempts >= max_attempts:
            logger.error(
                "outbox: consumer %s parked message %s (tenant %s, %s) after %d attempts: %s",
                consumer.name, message.message_id, message.tenant_id, message.topic,
                attempts, exc,
            )
            with tenant_context(message.tenant_id, using=worker):
                store.park(worker, consumer.name, message, attempts, error)
            # Past the parked message too: it is the (done + 1)th of the batch.
            store.advance_offset(worker, consumer.name, partition,
                                 batch.position_after(offset.position, done + 1))
            return BatchResult(handled=done, failed=True, parked=True, full=True)
        delay = backoff(attempts, consumer.retry_backoff, consumer.retry_backoff_max)
        logger.warning(
            "outbox: consumer %s failed on message %s (tenant %s, %s), attempt %d of %d, "
            "retrying in %.1f s: %s",
            consumer.name, message.message_id, message.tenant_id, message.topic,
            attempts, max_attempts, delay, exc,
        )
        head_failure = HeadFailure(attempts, delay, error[-4000:])
        with tenant_context(message.tenant_id, using=worker):
            store.record_failure(worker, consumer.name, partition, message, head_failure)
        position = batch.position_after(offset.position, done)  # up to the failing message
        store.advance_offset(worker, consumer.name, partition, position, head_failure)
        return BatchResult(handled=done, failed=True)


def _handle(
    consumer: Consumer, messages: list[Message], alias: str
) -> tuple[int, tuple[Message, Exception] | None]:
    """Run ``handle`` over ``messages``; return how many of the first succeeded.

    The fast path handles the batch one tenant at a time (one savepoint and
    one tenant switch per tenant, not per message; per-key order holds since a
    key belongs to one tenant). If anything raises, that work is rolled back
    and the batch is handled again in stream order, one savepoint per
    message, to find the first failure; the messages before it are kept.
    """
    try:
        with transaction.atomic(using=alias):
            ordered = sorted(messages, key=lambda m: m.tenant_id)  # stable: keeps key order
            for tenant_id, group in groupby(ordered, key=lambda m: m.tenant_id):
                with tenant_context(tenant_id, using=alias):
                    for message in group:
                        _handle_one(consumer, message)
        return len(messages), None
    except Exception as exc:
        _raise_if_lost(alias, exc)
    for index, message in enumerate(messages):
        try:
            with tenant_context(message.tenant_id, using=alias):
                _handle_one(consumer, message)
        except Exception as exc:
            _raise_if_lost(alias, exc)
            return index, (message, exc)
    return len(messages), None


def _raise_if_lost(alias: str, exc: Exception) -> None:
    """A batch whose connection is gone (cut, restarted server) failed no message of its own.

    Raised as a database error, for the loop to reconnect and run the batch
    again (docs/operations.md), instead of counting it as the message's attempt
    and going on in a transaction that can no longer do anything.
    """
    raw = connections[alias].connection
    if raw is not None and (raw.closed or raw.broken):
        raise OperationalError(f"the batch's connection was lost: {exc}") from exc


def _handle_one(consumer: Consumer, message: Message) -> None:
    """``consumer.handle(message)``, in an ``outbox.consume`` span of the message's trace."""
    if not tracing.enabled():
        consumer.handle(message)
        return
    attributes = {**tracing.message_attributes(message), "outbox.consumer": consumer.name}
    with tracing.message_span("outbox.consume", message.headers, attributes):
        consumer.handle(message)


def run_consumers(
    consumers: Sequence[Consumer],
    *,
    stop: Any = None,
    once: bool = False,
) -> int:
    """Run ``consumers`` (all their partitions) until stopped; return messages handled.

    One process may run many consumers; several processes may run the same
    ones: each batch locks its partition's offset row with SKIP LOCKED, so
    workers share partitions without a leader. With ``once``, returns when
    every partition is idle (or held by another worker).
    """
    import threading

    from outbox.loops import run_loop, stop_on_signals
    from outbox.publishing import wake_up

    require_cross_tenant_reader(system_alias())
    for consumer in consumers:
        validate(consumer)
        ensure_offsets(consumer)
    work = [(c, p) for c in consumers for p in range(c.partitions)]
    total = 0
    turn = 0
    #: When each paced partition (its consumer's max_rate) may run its next batch.
    ready_at: dict[tuple[str, int], float] = {}
    stop = stop or threading.Event()

    def step() -> bool:
        nonlocal total, turn
        busy = False
        paced: list[float] = []
        # Start from a different partition each round, so that two workers
        # started together do not keep colliding on the same rows.
        turn = (turn + 1) % max(len(work), 1)
        for consumer, partition in work[turn:] + work[:turn]:
            started = time.monotonic()
            if ready_at.get((consumer.name, partition), started) > started:
                paced.append(ready_at[consumer.name, partition])
                continue
            result = run_batch(consumer, partition)
            total += result.handled
            busy = busy or result.full
            if consumer.max_rate is not None and result.handled:
                ready_at[consumer.name, partition] = started + result.handled / consumer.max_rate
        if paced and not busy:
            # A paced partition has more to do: wait for the first of them, but
            # poll the others at least every POLL_INTERVAL.
            stop.wait(min(min(paced) - time.monotonic(), outbox_settings.POLL_INTERVAL))
            return True
        return busy

    with stop_on_signals(stop):
        run_loop(step, name="run_consumers", stop=stop, wake_up=wake_up, once=once)
    return total
