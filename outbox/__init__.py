"""A transactional outbox with gap-safe consumers and a relay to a broker.

``from outbox import publish, Consumer`` is the usual entry point::

    with tenant_context(42):
        order = Order.objects.create(...)
        publish("order.created", {"id": order.pk}, key=f"order:{order.pk}")

Everything listed in ``__all__`` is the public surface; other modules are
the implementation.
"""

from typing import TYPE_CHECKING

from django_idempotency_outbox import __version__
from django_idempotency_outbox.exports import lazy_exports

__all__ = [
    "Consumer",
    "ConsumerConfigError",
    "InMemoryTransport",
    "Message",
    "NoTenant",
    "NotInTransaction",
    "OutboxError",
    "ReceiverTask",
    "Relay",
    "Transport",
    "__version__",
    "health_view",
    "message_from_record",
    "observe",
    "publish",
    "receive",
    "receiver",
    "receiver_task",
    "relay_pending",
    "run_consumers",
    "status",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "publish": "outbox.publishing",
        "Consumer": "outbox.consumers",
        "run_consumers": "outbox.consumers",
        "Message": "outbox.stream",
        "receive": "outbox.receivers",
        "receiver": "outbox.celery",
        "receiver_task": "outbox.django_tasks",
        "ReceiverTask": "outbox.celery",
        "Relay": "outbox.relay",
        "status": "outbox.observation",
        "observe": "outbox.observation",
        "Transport": "outbox.transports",
        "InMemoryTransport": "outbox.testing",
        "relay_pending": "outbox.testing",
        "OutboxError": "outbox.exceptions",
        "NotInTransaction": "outbox.exceptions",
        "NoTenant": "outbox.exceptions",
        "ConsumerConfigError": "outbox.exceptions",
        "health_view": "outbox.views",
        "message_from_record": "outbox.debezium",
    },
)

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from outbox.celery import ReceiverTask, receiver
    from outbox.consumers import Consumer, run_consumers
    from outbox.debezium import message_from_record
    from outbox.django_tasks import receiver_task
    from outbox.exceptions import ConsumerConfigError, NoTenant, NotInTransaction, OutboxError
    from outbox.observation import observe, status
    from outbox.publishing import publish
    from outbox.receivers import receive
    from outbox.relay import Relay
    from outbox.stream import Message
    from outbox.testing import InMemoryTransport, relay_pending
    from outbox.transports import Transport
    from outbox.views import health_view
