"""A transactional outbox with gap-safe consumers and a relay to a broker.

``from outbox import publish, Consumer`` is the usual entry point::

    with tenant_context(42), transaction.atomic():
        order = Order.objects.create(...)
        publish("order.created", {"id": order.pk}, key=f"order:{order.pk}")
"""

from typing import Any

__all__ = ["Consumer", "Message", "publish"]


def __getattr__(name: str) -> Any:
    # Imported lazily: models must not be imported while Django loads its apps.
    if name == "publish":
        from outbox.publishing import publish

        return publish
    if name == "Consumer":
        from outbox.consumers import Consumer

        return Consumer
    if name == "Message":
        from outbox.stream import Message

        return Message
    raise AttributeError(f"module 'outbox' has no attribute {name!r}")
