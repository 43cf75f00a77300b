"""The Celery app of the fault tests: a receiver built as the docs say.

``celery -A tests.outbox.support.fault_worker_app worker``: one task,
``tests.faults.receive``, an ``outbox.ReceiverTask`` whose body is an
``outbox.receiver``. Its effect is an Order whose note is the message id; the
payload steers it:

- ``sleep``: seconds to wait inside the transaction, after the write (so a
  duplicate delivered meanwhile waits for it);
- ``hold``: a directory; the first delivery writes ``<message id>.pid``
  there (its process id) and then waits for a minute, to be killed;
- ``fail_while``: a file; the receiver raises while it exists.

``DIO_VISIBILITY_TIMEOUT`` sets the broker's visibility timeout, and the
broker looks for unacknowledged messages every second, so that a message
taken by a killed worker comes back within seconds (an hour by default).

``DIO_BROKER_URL`` puts the app on another broker than the suite's Redis:
RabbitMQ (with publisher confirms, which the outbox requires; no visibility
timeout there: a message comes back when its worker's connection closes).

``DIO_BROKER_WRITE_URL`` sends what the worker publishes (a retry) to another broker than
the one it consumes from: a dead port makes every retry unsendable.

``DIO_STALL_AFTER_POP``, a file: the worker stops for an hour right after it
has taken a message from its Redis list and before kombu records it as
unacknowledged (touching the file first), to be killed in that window.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.outbox.support.fault_process_settings")
django.setup()

from celery import Celery  # noqa: E402
from django.conf import settings  # noqa: E402

from outbox import ReceiverTask, receiver  # noqa: E402
from outbox.stream import Message  # noqa: E402
from tests.outbox.support.effects import record_order  # noqa: E402

TASK = "tests.faults.receive"

if os.environ.get("DIO_STALL_AFTER_POP"):
    from kombu.transport import redis as kombu_redis

    _record_unacked = kombu_redis.QoS.append

    def _stall_then_record(self, message, delivery_tag):  # type: ignore[no-untyped-def]
        Path(os.environ["DIO_STALL_AFTER_POP"]).touch()
        time.sleep(3600)
        return _record_unacked(self, message, delivery_tag)

    kombu_redis.QoS.append = _stall_then_record

BROKER_URL = os.environ.get("DIO_BROKER_URL") or settings.CELERY_BROKER_URL
app = Celery("dio_receiver_tests", broker=BROKER_URL)
if os.environ.get("DIO_BROKER_WRITE_URL"):
    app.conf.broker_write_url = os.environ["DIO_BROKER_WRITE_URL"]
app.conf.update(
    task_default_queue=settings.OUTBOX["CELERY_QUEUE"],
    worker_prefetch_multiplier=4,
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    broker_transport_options={"confirm_publish": True} if BROKER_URL.startswith("amqp") else {
        "visibility_timeout": float(os.environ.get("DIO_VISIBILITY_TIMEOUT", "3600")),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
)


# shared=False: this app's task only. A shared task (Celery's default) would join
# every Celery app created after this module is imported, such as the apps
# tests/outbox/test_checks.py builds to check their receivers.
@app.task(base=ReceiverTask, name=TASK, shared=False)
@receiver(TASK)
def receive(message: Message) -> None:
    record_order(message)
