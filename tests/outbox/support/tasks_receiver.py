"""The receiver of the Django tasks tests: an outbox receiver written as a Django task.

Its effect is an Order whose note is the message id (as tests/outbox/support/fault_worker_app.py's
Celery task); the payload steers it the same way:

- ``hold``: a directory; the first delivery writes ``<message id>.pid`` there
  (its process id) and waits a minute, to be killed mid-task;
- ``fail_while``: a file; the receiver raises while it exists.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from outbox.django_tasks import receiver_task
from outbox.stream import Message
from tenancy import current_tenant_id
from tests.testapp.models import Order


@receiver_task("tests.tasks.receive")
def receive(message: Message) -> None:
    payload = message.payload
    Order.objects.create(
        tenant_id=current_tenant_id(),
        sku=str(payload.get("sku", ""))[:50],
        note=str(message.message_id),
    )
    if payload.get("fail_while") and Path(payload["fail_while"]).exists():
        raise RuntimeError(f"failing while {payload['fail_while']} exists")
    if payload.get("hold"):
        marker = Path(payload["hold"]) / f"{message.message_id}.pid"
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            time.sleep(60)
