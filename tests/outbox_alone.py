"""What tests/test_layers.py runs with the outbox alone (tests/settings_outbox_alone.py)."""

from __future__ import annotations

import sys

from outbox import Consumer, Message, publish


class Echo(Consumer):
    """Answers each ``order.placed`` with an ``order.seen``, in its batch's transaction."""

    name = "echo"
    topics = ["order.placed"]

    def handle(self, message: Message) -> None:
        publish("order.seen", {"seen": str(message.message_id)}, key=message.key)


def place(tenant_id: int) -> None:
    """Publish one ``order.placed`` as ``tenant_id``; print what was imported."""
    from tenancy import tenant_context

    with tenant_context(tenant_id):
        message_id = publish("order.placed", {"sku": "alone"}, key="order:1")
    print(f"published {message_id}")
    ours = ("idempotency", "outbox", "tenancy")
    loaded = sorted(m for m, module in sys.modules.items() if module and m.split(".")[0] in ours)
    print("imported:", " ".join(loaded))
