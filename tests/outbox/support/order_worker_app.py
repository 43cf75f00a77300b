"""The Celery app of the end-to-end tests (run as a real worker subprocess).

``celery -A tests.outbox.support.order_worker_app worker -Q <queue>``: receives the
envelopes the relay sends and records each as an Order, de-duplicated by
message id in the same transaction (outbox.receivers).

The broker is the suite's Redis, or ``DIO_BROKER_URL`` (RabbitMQ, with
publisher confirms, as the outbox requires). :func:`build` makes the same app
for another broker, for the relay of a test in this process.
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from celery import Celery  # noqa: E402
from django.conf import settings  # noqa: E402

from outbox import receiver  # noqa: E402
from outbox.stream import Message  # noqa: E402
from tenancy import current_tenant_id  # noqa: E402
from tests.testapp.models import Order  # noqa: E402


@receiver("tests.receive_order")
def receive_order(message: Message) -> None:
    Order.objects.create(
        tenant_id=current_tenant_id(),
        sku=str(message.payload.get("sku", ""))[:50],
        note=str(message.message_id),
    )


def build(broker_url: str) -> Celery:
    """The end-to-end tests' app on ``broker_url`` (RabbitMQ: with publisher confirms)."""
    built = Celery("dio_outbox_tests", broker=broker_url, set_as_current=False)
    built.conf.update(
        task_default_queue=settings.OUTBOX["CELERY_QUEUE"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=16,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
    )
    if broker_url.startswith("amqp"):
        built.conf.broker_transport_options = {"confirm_publish": True}
    # shared=False: this app's task only. A shared task (Celery's default) joins
    # every Celery app created after this module is imported, such as the apps
    # tests/outbox/test_checks.py builds to check their receivers.
    built.task(name="tests.outbox.receive_order", shared=False)(receive_order)
    return built


app = build(os.environ.get("DIO_BROKER_URL") or settings.CELERY_BROKER_URL)
app.set_current()
