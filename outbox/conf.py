"""The ``OUTBOX`` settings dict and its defaults (documented in docs/settings.md)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django_idempotency_outbox.conf import (
    AppSettings,
    Setting,
    boolean,
    dotted_path_or_object,
    integer,
    objects,
    optional,
    seconds,
    secret,
    text,
    text_mapping,
)


@dataclass(frozen=True)
class SigningKey:
    """A secret of ``OUTBOX["SIGNING_KEYS"]`` and the id that names it in signatures.

    The id is the first 8 hex digits of a SHA-256 of the secret: it lets a
    receiver pick the key a signature was made with, and a log say which key
    that was, without revealing anything of the secret.
    """

    key_id: str
    secret: bytes = field(repr=False)

    @classmethod
    def of(cls, secret: bytes) -> SigningKey:
        return cls(hashlib.sha256(b"outbox signing key id\0" + secret).hexdigest()[:8], secret)


def signing_keys(value: Any, label: str) -> tuple[SigningKey, ...]:
    """A list of secrets (strings or bytes), each at least 32 bytes long; the first signs.

    The error messages name the position of a bad secret, never its value.
    """
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"{label} must be a list of secrets (strings or bytes), not a "
                        f"{type(value).__name__}")
    keys: list[SigningKey] = []
    for position, item in enumerate(value):
        key = SigningKey.of(secret(item, f"{label}[{position}]"))
        if any(k.key_id == key.key_id for k in keys):
            raise ValueError(f"{label}[{position}] repeats an earlier key")
        keys.append(key)
    return tuple(keys)


class OutboxSettings(AppSettings):
    namespace = "OUTBOX"

    #: Dotted paths of the outbox.Consumer subclasses that `run_consumers` runs
    #: and whose offsets retention waits for.
    CONSUMERS: Setting[tuple[Any, ...]] = Setting((), objects)
    #: Messages read per consumer transaction.
    CONSUMER_BATCH_SIZE = Setting(500, integer(minimum=1))
    #: Consumers: during a batch, the database ends the session of a consumer
    #: whose host stopped answering (TCP keepalives) after about this long, so
    #: that its partition's lock is released; 0 leaves the server's settings.
    CONSUMER_LOST_AFTER = Setting(timedelta(seconds=3), seconds())
    #: Attempts at one message before it is parked in the dead-letter table.
    MAX_ATTEMPTS = Setting(5, integer(minimum=1))
    #: Delay before the second attempt; doubled for each further attempt.
    RETRY_BACKOFF = Setting(timedelta(seconds=1), seconds())
    #: Longest delay between two attempts.
    RETRY_BACKOFF_MAX = Setting(timedelta(minutes=5), seconds())
    #: Relay: whether a relay runs (retention then waits for its offset too).
    RELAY = Setting(True, boolean)
    #: Relay: the name of its offset row ("relay:<name>" in consumer_offsets).
    RELAY_NAME = Setting("default", text(max_length=190))
    #: Relay: dotted path of the transport class, or an instance.
    TRANSPORT: Setting[Any] = Setting("outbox.transports.CeleryTransport", dotted_path_or_object)
    #: Relay: messages read and published per round.
    RELAY_BATCH_SIZE = Setting(1000, integer(minimum=1))
    #: Relay: how long one relay owns the stream after its last renewal. A
    #: heartbeat thread renews it every quarter of this, whatever the batch in
    #: flight is doing, so this is also how soon a relay that died (SIGKILL, a
    #: lost host) is replaced by one that waits.
    RELAY_LEASE = Setting(timedelta(seconds=1), seconds(allow_zero=False))
    #: Relay: first and longest pause after the broker fails.
    BROKER_BACKOFF = Setting(timedelta(milliseconds=500), seconds())
    BROKER_BACKOFF_MAX = Setting(timedelta(seconds=30), seconds())
    #: Loops: seconds to sleep when there was nothing to do (the polling fallback
    #: of the on-commit wake-up).
    POLL_INTERVAL = Setting(0.05, seconds())
    #: Loops: pause after a database error before trying again (doubled up to 30 s).
    DATABASE_BACKOFF = Setting(timedelta(seconds=1), seconds())
    #: Dotted path of a callable() run after every commit that published
    #: messages, e.g. to wake a relay on another host. None: only relays in
    #: this process are woken; others find the messages by polling.
    ON_COMMIT: Setting[Any] = Setting(None, optional(dotted_path_or_object))
    #: Celery transport: the Celery app (dotted path) or None for current_app.
    CELERY_APP: Setting[Any] = Setting(None, optional(dotted_path_or_object))
    #: Celery transport: the task each message is sent to, and per-topic overrides.
    CELERY_TASK = Setting(None, optional(text()))
    CELERY_TOPIC_TASKS = Setting({}, text_mapping)
    #: Celery transport: queue for the sent tasks; None leaves it to task_routes.
    CELERY_QUEUE = Setting(None, optional(text()))
    #: Celery transport: True sends through app.send_task (slower; runs the
    #: publish signals); False builds the message with Celery and publishes
    #: it with kombu directly.
    CELERY_SEND_TASK = Setting(False, boolean)
    #: Django tasks transport (outbox.django_tasks.DjangoTasksTransport): the
    #: task (dotted path of a Django Task) each message is enqueued to, and
    #: per-topic overrides.
    TASKS_TASK = Setting(None, optional(text()))
    TASKS_TOPIC_TASKS = Setting({}, text_mapping)
    #: Django tasks receivers on django-tasks-db: a receiver task still marked
    #: RUNNING this long after it started, whose worker no longer holds its
    #: row (the worker died), is made ready again by requeue_outbox_tasks.
    TASKS_STALLED_AFTER = Setting(timedelta(seconds=30), seconds(allow_zero=False))
    #: Receivers (outbox.receiver, Celery; outbox.django_tasks.receiver_task):
    #: attempts at one message, the first included, before it is parked in the
    #: dead-letter table.
    RECEIVER_MAX_ATTEMPTS = Setting(10, integer(minimum=1))
    #: Celery receivers: delay before the second attempt; doubled for each further one.
    RECEIVER_RETRY_BACKOFF = Setting(timedelta(seconds=1), seconds())
    #: Celery receivers: the longest delay between two attempts. Keep it below
    #: the broker's visibility timeout (Redis: 1 hour by default).
    RECEIVER_RETRY_BACKOFF_MAX = Setting(timedelta(minutes=5), seconds())
    #: Relay and receivers: secrets. The relay signs every envelope with the
    #: first; receivers accept a signature made with any of them and refuse a
    #: message without a valid one (docs/outbox.md). Empty: nothing is signed
    #: or verified.
    SIGNING_KEYS: Setting[tuple[SigningKey, ...]] = Setting((), signing_keys)
    #: Retention: messages older than this AND passed by every reader are deleted.
    RETENTION = Setting(timedelta(days=7), seconds())
    #: Retention: rows of outbox_received (the receivers' de-duplication
    #: memory) older than this are deleted. Keep it longer than the longest
    #: time a message can spend in the broker.
    RECEIVED_RETENTION = Setting(timedelta(days=7), seconds())
    #: Rows deleted per reaper transaction.
    REAP_BATCH_SIZE = Setting(5000, integer(minimum=1))
    #: Health checks (outbox_health, outbox.health_view): a reader whose oldest
    #: unpassed readable message is older than this is unhealthy.
    HEALTH_MAX_LAG = Setting(timedelta(seconds=60), seconds(allow_zero=False))
    #: Health checks: a relay whose lease ran out more than this long ago (or
    #: that holds none) is unhealthy: no relay is running.
    HEALTH_MAX_LEASE_AGE = Setting(timedelta(seconds=10), seconds())


outbox_settings = OutboxSettings()
