"""The Celery app of the worker that runs the library's scheduled tasks in the tests.

The receivers' app (tests/outbox/support/order_worker_app.py), which also imports the
library's task modules, as docs/operations.md tells a deployment's worker to.
"""

from __future__ import annotations

from importlib import import_module

from tests.outbox.support.order_worker_app import app  # sets Django up: the task modules need it

for _tasks in ("outbox.tasks", "idempotency.tasks"):
    import_module(_tasks)

__all__ = ["app"]
