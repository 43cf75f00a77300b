"""The effect of the receivers the fault tests run (a Celery task and a Django task alike).

An Order whose note is the message id, once per handled message; the payload
steers it:

- ``fail_while``: a file; the receiver raises while it exists;
- ``sleep``: seconds to take after the effect;
- ``hold``: a directory; the first delivery writes ``<message id>.pid`` there
  (its process id) and waits a minute, to be killed mid-task.

No Celery here: the Django tasks tests run it in a project without Celery.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from outbox.stream import Message
from tenancy import current_tenant_id
from tests.testapp.models import Order


def record_order(message: Message) -> None:
    payload = message.payload
    Order.objects.create(
        tenant_id=current_tenant_id(),
        sku=str(payload.get("sku", ""))[:50],
        note=str(message.message_id),
    )
    if payload.get("fail_while") and Path(payload["fail_while"]).exists():
        raise RuntimeError(f"failing while {payload['fail_while']} exists")
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    if payload.get("hold"):
        marker = Path(payload["hold"]) / f"{message.message_id}.pid"
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            time.sleep(60)
