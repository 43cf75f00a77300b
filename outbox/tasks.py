"""Celery tasks doing the same jobs as the management commands.

Schedule them with Celery beat, e.g.::

    app.conf.beat_schedule = {
        "outbox-relay": {"task": "outbox.relay", "schedule": 1.0},
        "outbox-consumers": {"task": "outbox.run_consumers", "schedule": 1.0},
        "outbox-reap": {"task": "outbox.reap", "schedule": 3600.0},
        "outbox-parked-jobs": {"task": "outbox.work_parked_jobs", "schedule": 5.0},
    }

Each run drains what is ready and returns: a long-running ``relay_outbox`` or
``run_consumers`` process gives lower latency; the tasks suit deployments that
already run Celery workers and beat. Runs that overlap are safe: the relay's
lease and the consumers' row locks make the second one find nothing to do.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task


@shared_task(name="outbox.relay", ignore_result=True)
def relay() -> int:
    """Relay every committed message to the transport; return how many."""
    from outbox.relay import Relay

    relay = Relay()
    try:
        return relay.drain()
    finally:
        relay.release()  # the next run (a new Relay) may start at once


@shared_task(name="outbox.run_consumers", ignore_result=True)
def run_consumers(names: list[str] | None = None) -> int:
    """Run the consumers (all, or ``names``) until idle; return messages handled."""
    from outbox.consumers import run_consumers as run
    from outbox.consumers import select_consumers

    return run(select_consumers(names or ()), once=True)


@shared_task(name="outbox.reap", ignore_result=True)
def reap() -> dict[str, Any]:
    """Delete expired messages that every reader has passed."""
    from outbox.retention import reap as do_reap

    result = do_reap()
    return {"messages": result.messages, "received": result.received}


@shared_task(name="outbox.work_parked_jobs", ignore_result=True)
def work_parked_jobs() -> list[int]:
    """Do the re-drive and discard jobs that wait (asked for in the admin or by
    ``outbox_parked --background``); return the ids of those finished."""
    from outbox.deadletters import work

    return [job.pk for job in work()]
