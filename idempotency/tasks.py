"""Celery tasks of the idempotency app (``pip install django-idempotency-outbox[celery]``).

Schedule the reaper with Celery beat (docs/operations.md)::

    CELERY_BEAT_SCHEDULE = {
        "reap-idempotency-keys": {
            "task": "idempotency.tasks.reap_expired_keys",
            "schedule": 3600.0,
        },
    }
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from idempotency import reaper


@shared_task(name="idempotency.tasks.reap_expired_keys")
def reap_expired_keys(
    batch_size: int | None = None, pause: float | None = None
) -> dict[str, Any]:
    """Delete expired keys of every tenant; the same job as ``reap_idempotency_keys``."""
    return reaper.reap_expired_keys(batch_size=batch_size, pause=pause).as_dict()


@shared_task(name="idempotency.tasks.complete_abandoned_keys")
def complete_abandoned_keys(limit: int | None = None) -> dict[str, Any]:
    """Finish abandoned phases-mode requests; the job of ``complete_idempotency_keys``."""
    from idempotency import completer

    return completer.complete_abandoned_keys(limit=limit).as_dict()
