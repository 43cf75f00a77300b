"""Receiving relayed messages, each message's effect once, whatever runs the receiver.

The relay delivers at least once, so a receiver records each message id in
``outbox_received`` in the transaction of its own writes: a duplicate finds
the id there and is skipped (a concurrent one waits on the primary key), and
a failure rolls the record back with the writes. An envelope whose signature
does not verify is refused first (:mod:`outbox.signing`). A failing receiver
task is retried, then parked (:func:`retry_or_park`): Celery's are built with
:func:`outbox.celery.receiver`, Django's with :func:`outbox.django_tasks.receiver_task`.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from django.db import transaction
from django.utils import timezone

from django_idempotency_outbox import tracing
from django_idempotency_outbox.durations import backoff
from outbox import metrics, signing, store
from outbox.conf import outbox_settings
from outbox.stream import Message
from tenancy import tenant_context
from tenancy.aliases import app_alias

T = TypeVar("T")

logger = logging.getLogger("outbox")


def receive(
    envelope: dict[str, Any] | Message,
    handler: Callable[[Message], T],
    *,
    receiver: str,
    using: str | None = None,
) -> tuple[bool, T | None]:
    """Run ``handler(message)`` unless ``receiver`` has already handled the message.

    Runs in one transaction on the app alias, as the message's tenant. A
    failure propagates, with everything rolled back: retrying it is the
    caller's business (a receiver task does it: :func:`outbox.celery.receiver`).

    With ``OUTBOX["SIGNING_KEYS"]`` set, an envelope is first verified: one
    that the relay did not sign, or that was altered on the way, is refused
    (logged as an ERROR) before the transaction opens. A :class:`Message` is
    not verified: your own code built it (a re-drive builds it from the
    dead-letter table).

    Args:
        envelope: what the Celery transport sent (or a :class:`Message`).
        handler: the task's work; its database writes join the transaction.
        receiver: a stable name for this handler; each receiver handles each
            message once (two tasks that receive one message each run).
        using: database alias; ``TENANCY["APP_DATABASE"]`` when omitted.

    Returns:
        ``(True, result)`` when the handler ran, ``(False, None)`` for a duplicate.

    Raises:
        outbox.exceptions.BadSignature: the envelope's signature does not verify.
    """
    if isinstance(envelope, Message):
        message = envelope
    else:
        signing.check(envelope, by=f"receiver {receiver}")
        message = Message.from_envelope(envelope)
    alias = app_alias(using)
    with tenant_context(message.tenant_id, using=alias):
        if not store.record_received(alias, message.tenant_id, receiver, message.message_id):
            logger.info("outbox: receiver %s skipped message %s of tenant %s: already handled",
                        receiver, message.message_id, message.tenant_id)
            return False, None
        attributes = {**tracing.message_attributes(message), "outbox.receiver": receiver}
        with tracing.message_span("outbox.receive", message.headers, attributes):
            result = handler(message)
    metrics.consumed(receiver)  # committed
    return True, result


#: The pause before a receiver's second attempt, in seconds; doubled for each
#: further one, up to ``OUTBOX["RECEIVER_RETRY_BACKOFF_MAX"]``.
RETRY_BACKOFF = 1.0


def retry_pause(attempt: int) -> float:
    """Seconds before attempt ``attempt + 1``: :data:`RETRY_BACKOFF` doubled per attempt,
    up to ``RECEIVER_RETRY_BACKOFF_MAX``."""
    return backoff(attempt, RETRY_BACKOFF, outbox_settings.RECEIVER_RETRY_BACKOFF_MAX)


def retry_or_park(task: str, dead_letter: str, message: Message, attempt: int, exc: Exception,
                  retry: Callable[[int, float], object], *, using: str | None) -> int | None:
    """What a worker does when receiver ``task`` failed on ``message``: Celery's and Django's.

    While attempts remain, ``retry(next attempt, pause)`` after :func:`retry_pause`;
    then the message is parked as ``dead_letter``. If even that fails (the database
    is still down), ``retry`` again after the longest pause: a message is never
    settled without its effect or its dead letter. Each step is logged.

    Returns:
        The attempt ``retry`` was asked for, or None once the message is parked.
    """
    limit = outbox_settings.RECEIVER_MAX_ATTEMPTS
    where = f"message {message.message_id} of tenant {message.tenant_id}"
    if attempt < limit:
        pause = retry_pause(attempt)
        logger.warning("outbox: task %s failed on %s (attempt %d of %d): %s: %s; retrying in "
                       "%.1f s", task, where, attempt, limit, type(exc).__name__, exc, pause)
        retry(attempt + 1, pause)
        return attempt + 1
    try:
        park(dead_letter, message, attempt, exc, using=using)
    except Exception as parking:
        pause = outbox_settings.RECEIVER_RETRY_BACKOFF_MAX
        logger.error("outbox: task %s could not park %s after %d attempts (%s: %s); trying it "
                     "again in %.1f s", task, where, attempt, type(parking).__name__, parking,
                     pause)
        retry(attempt, pause)
        return attempt
    logger.error("outbox: task %s gave up on %s after %d attempts and parked it as %s (manage.py "
                 "outbox_parked --redrive handles it again): %s: %s", task, where, attempt,
                 dead_letter, type(exc).__name__, exc)
    return None


def park(consumer: str, message: Message, attempts: int, exc: BaseException,
         *, using: str | None = None) -> None:
    """Copy ``message`` into ``outbox_dead_letters`` as ``consumer``, with ``exc``'s traceback.

    As the message's tenant, on the app alias, in a transaction of its own;
    once per message and consumer (a second call finds the row and adds none).
    """
    alias = app_alias(using)
    if message.created_at is None:
        message = replace(message, created_at=timezone.now())
    error = "".join(traceback.format_exception(exc)).strip()
    with tenant_context(message.tenant_id, using=alias):
        from outbox.models import DeadLetter

        if not DeadLetter.objects.using(alias).filter(consumer=consumer,
                                                      message_id=message.message_id).exists():
            store.park(alias, consumer, message, attempts, error)
            transaction.on_commit(lambda: metrics.parked(consumer), using=alias)
