"""The receiver of the Django tasks tests: an outbox receiver written as a Django task.

Its effect, steered by the payload, is the Celery task's of
tests/outbox/support/fault_worker_app.py: tests/outbox/support/effects.py.
"""

from __future__ import annotations

from outbox.django_tasks import receiver_task
from outbox.stream import Message
from tests.outbox.support.effects import record_order


@receiver_task("tests.tasks.receive")
def receive(message: Message) -> None:
    record_order(message)
