"""The Celery tasks do what the commands do (called in-process here; the
end-to-end test in test_processes.py runs a real worker)."""

from __future__ import annotations

from outbox import tasks
from outbox.testing import InMemoryTransport
from tests.outbox.support.helpers import effects, publish_many, wait_for

A = 1


def test_run_consumers_task_handles_what_is_ready():
    ids = publish_many(A, "order.placed", [{"sku": "a"}])
    wait_for(lambda: tasks.run_consumers(["orders"]) >= 0 and len(effects()) == 1, "handled")
    assert effects() == {str(ids[0]): 1}


def test_relay_task_sends_what_is_ready(settings):
    memory = InMemoryTransport()
    settings.OUTBOX = {**settings.OUTBOX, "TRANSPORT": memory}
    ids = publish_many(A, "order.placed", [{"sku": "a"}])
    wait_for(lambda: tasks.relay() >= 0 and len(memory.sent) == 1, "relayed")
    assert memory.message_ids == [str(ids[0])]


def test_reap_task_reports_counts(settings):
    settings.OUTBOX = {**settings.OUTBOX, "CONSUMERS": [], "TRANSPORT": None}
    assert tasks.reap() == {"messages": 0, "received": 0}
