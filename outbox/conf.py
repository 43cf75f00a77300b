"""The ``OUTBOX`` settings dict and its defaults (documented in docs/outbox.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tenancy.conf import AppSettings

DEFAULTS: dict[str, Any] = {
    # Dotted paths of the outbox.Consumer subclasses that `run_consumers` runs
    # and whose offsets retention waits for.
    "CONSUMERS": (),
    # Messages read per consumer transaction.
    "CONSUMER_BATCH_SIZE": 500,
    # Attempts at one message before it is parked in the dead-letter table.
    "MAX_ATTEMPTS": 5,
    # Delay before the second attempt; doubled for each further attempt.
    "RETRY_BACKOFF": timedelta(seconds=1),
    # Longest delay between two attempts.
    "RETRY_BACKOFF_MAX": timedelta(minutes=5),
    # Relay: whether a relay runs (retention then waits for its offset too).
    "RELAY": True,
    # Relay: the name of its offset row ("relay:<name>" in consumer_offsets).
    "RELAY_NAME": "default",
    # Relay: dotted path of the transport class, or an instance.
    "TRANSPORT": "outbox.transports.CeleryTransport",
    # Relay: messages read and published per round.
    "RELAY_BATCH_SIZE": 1000,
    # Relay: how long one relay owns the stream before another may take over
    # (renewed every round; only matters when a relay dies).
    "RELAY_LEASE": timedelta(seconds=30),
    # Relay: first and longest pause after the broker fails.
    "BROKER_BACKOFF": timedelta(milliseconds=500),
    "BROKER_BACKOFF_MAX": timedelta(seconds=30),
    # Loops: seconds to sleep when there was nothing to do (the polling fallback
    # of the on-commit wake-up).
    "POLL_INTERVAL": 0.05,
    # Loops: pause after a database error before trying again (doubled up to 30 s).
    "DATABASE_BACKOFF": timedelta(seconds=1),
    # Dotted path of a callable() run after every commit that published
    # messages, e.g. to wake a relay on another host. None: only relays in
    # this process are woken; others find the messages by polling.
    "ON_COMMIT": None,
    # Celery transport: the Celery app (dotted path) or None for current_app.
    "CELERY_APP": None,
    # Celery transport: the task each message is sent to, and per-topic overrides.
    "CELERY_TASK": None,
    "CELERY_TOPIC_TASKS": {},
    # Celery transport: queue for the sent tasks; None leaves it to task_routes.
    "CELERY_QUEUE": None,
    # Celery transport: True sends through app.send_task (slower; runs the
    # publish signals); False builds the message with Celery and publishes
    # it with kombu directly.
    "CELERY_SEND_TASK": False,
    # Retention: messages older than this AND passed by every reader are deleted.
    "RETENTION": timedelta(days=7),
    # Retention: rows of outbox_received (the receivers' de-duplication
    # memory) older than this are deleted. Keep it longer than the longest
    # time a message can spend in the broker.
    "RECEIVED_RETENTION": timedelta(days=7),
    # Rows deleted per reaper transaction.
    "REAP_BATCH_SIZE": 5000,
}

outbox_settings = AppSettings("OUTBOX", DEFAULTS)


def seconds(value: timedelta | int | float, name: str) -> float:
    """A duration setting as seconds; refuses what is not a positive duration."""
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = float(value)
    else:
        raise TypeError(f'OUTBOX["{name}"] must be a timedelta or seconds, not {value!r}')
    if result < 0:
        raise ValueError(f'OUTBOX["{name}"] must not be negative, not {value!r}')
    return result


def setting_seconds(name: str) -> float:
    return seconds(getattr(outbox_settings, name), name)
