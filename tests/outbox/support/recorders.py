"""Consumers the tests run. Their effect is an Order row per message, under RLS.

Each handler writes through the ordinary ORM, as the worker role, inside the
message's tenant context: an Order whose ``note`` is the message id, so the
tests count effects per message.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from outbox import Consumer, Message
from tenancy import current_tenant_id
from tests.testapp.models import Order

#: skus whose messages make the handler raise (in this process), until removed.
FAILING: set[str] = set()


class Boom(Exception):
    pass


def record(message: Message) -> Order:
    return Order.objects.create(
        tenant_id=current_tenant_id(),
        sku=str(message.payload.get("sku", message.key or ""))[:50],
        quantity=int(message.payload.get("seq", 1)),
        note=str(message.message_id),
    )


class OrderRecorder(Consumer):
    """Records order.placed; raises for poison messages and skus in FAILING."""

    name = "orders"
    topics = ["order.placed"]
    batch_size = 50
    retry_backoff = 0  # the backoff is tested on its own (test_consumers.py)

    def handle(self, message: Message) -> None:
        record(message)  # written first, so a failure has something to roll back
        sku = message.payload.get("sku", "")
        if message.payload.get("poison"):
            raise Boom(f"poison message {sku}")
        if sku in FAILING:
            raise Boom(f"transient failure on {sku}")


class PartitionedRecorder(Consumer):
    """Four partitions by key; quantity records the per-key sequence number."""

    name = "orders-partitioned"
    topics = ["order.sequenced"]
    partitions = 4
    batch_size = 20
    retry_backoff = 0

    def handle(self, message: Message) -> None:
        delay = float(os.environ.get("DIO_HANDLER_DELAY", "0"))
        if delay:
            time.sleep(delay)
        record(message)


class SlowRecorder(Consumer):
    """Hangs on a message whose sku is $DIO_HANG_ON, after touching $DIO_HANG_MARKER,
    for $DIO_HANG_SECONDS (an hour unless set) or until the marker is removed; on
    each such message once (a retry of its batch goes through).

    Used to kill, stop or cut off a consumer process while a batch is open.
    """

    name = "orders-slow"
    topics = ["order.slow"]
    batch_size = 10
    retry_backoff = 0
    hung: set[str] = set()

    def handle(self, message: Message) -> None:
        record(message)
        if (message.payload.get("sku") == os.environ.get("DIO_HANG_ON")
                and str(message.message_id) not in self.hung):
            SlowRecorder.hung.add(str(message.message_id))
            marker = Path(os.environ["DIO_HANG_MARKER"])
            marker.touch()
            until = time.monotonic() + float(os.environ.get("DIO_HANG_SECONDS", "3600"))
            while marker.exists() and time.monotonic() < until:
                time.sleep(0.02)
