"""Receiving relayed messages in Celery tasks, each message's effect once.

The relay delivers at least once, so a task may receive a message twice. The
receiver records the message id in ``outbox_received`` in the same
transaction as the task's own writes: a duplicate finds the id already there
and is skipped, and a task that fails rolls the record back with its writes,
so the retry runs it again. Concurrent duplicates wait on the primary key and
the second one is skipped when the first commits.

Example::

    @app.task(name="shop.order_created")
    @receiver("shop.order_created")
    def order_created(message):
        Invoice.objects.create(tenant_id=message.tenant_id, order_id=message.payload["id"])
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from outbox import store
from outbox.stream import Message
from tenancy import tenant_context
from tenancy.aliases import app_alias

T = TypeVar("T")


def receive(
    envelope: dict[str, Any] | Message,
    handler: Callable[[Message], T],
    *,
    receiver: str,
    using: str | None = None,
) -> tuple[bool, T | None]:
    """Run ``handler(message)`` unless ``receiver`` has already handled the message.

    Runs in one transaction on the app alias, as the message's tenant.

    Args:
        envelope: what the Celery transport sent (or a :class:`Message`).
        handler: the task's work; its database writes join the transaction.
        receiver: a stable name for this handler; each receiver handles each
            message once (two tasks that receive one message each run).
        using: database alias; ``TENANCY["APP_DATABASE"]`` when omitted.

    Returns:
        ``(True, result)`` when the handler ran, ``(False, None)`` for a duplicate.
    """
    message = envelope if isinstance(envelope, Message) else Message.from_envelope(envelope)
    alias = app_alias(using)
    with tenant_context(message.tenant_id, using=alias):
        if not store.record_received(alias, message.tenant_id, receiver, message.message_id):
            return False, None
        return True, handler(message)


def receiver(
    name: str, *, using: str | None = None
) -> Callable[[Callable[..., T]], Callable[..., T | None]]:
    """Decorate a task function to receive outbox envelopes once each.

    The decorated function takes a :class:`Message` (plus any further
    arguments the task is called with) and is skipped for a duplicate.
    """

    def decorate(func: Callable[..., T]) -> Callable[..., T | None]:
        @functools.wraps(func)
        def wrapper(envelope: dict[str, Any], *args: Any, **kwargs: Any) -> T | None:
            _, result = receive(
                envelope, lambda m: func(m, *args, **kwargs), receiver=name, using=using
            )
            return result

        return wrapper

    return decorate
