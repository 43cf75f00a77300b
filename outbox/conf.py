"""The ``OUTBOX`` settings dict and its defaults (documented in docs/settings.md).

The values earlier releases made settings and no deployment had a reason to
change are constants where they are used (the relay's and the loops'
backoffs), attributes of a consumer (its batch size, attempts, backoff), or
options of a command (batch sizes, the health check's lease age). ``manage.py
check`` reports each such key still set (``outbox.E091``), naming what
replaces it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django_idempotency_outbox.conf import (
    AppSettings,
    Setting,
    dotted_path_or_object,
    integer,
    objects,
    optional,
    seconds,
    secret,
    text,
    text_mapping,
)
from django_idempotency_outbox.errors import ConfigurationError


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


def task_routes(value: Any, label: str) -> dict[str, str]:
    """None, a task (every topic), or a dict topic -> task, ``"*"`` for every other topic.

    Always returned as the dict (``{}`` for None, ``{"*": task}`` for one task):
    :func:`task_for` reads it.
    """
    if value is None:
        return {}
    if isinstance(value, str):
        return {"*": text()(value, label)}
    return text_mapping(value, label)


def task_for(setting: str, kind: str, topic: str) -> str:
    """The task ``OUTBOX[setting]`` names for ``topic`` (its own, else ``"*"``'s), or
    ConfigurationError saying which setting to fill in."""
    routes: dict[str, str] = getattr(outbox_settings, setting)
    task = routes.get(topic) or routes.get("*")
    if not task:
        raise ConfigurationError(
            f'no {kind} task for topic {topic!r}: set OUTBOX["{setting}"] (a task, or a dict '
            'topic -> task with "*" for every other topic)')
    return task


class OutboxSettings(AppSettings):
    """The keys a deployment may change, each for a reason docs/settings.md gives."""

    namespace = "OUTBOX"
    removed = {
        "CONSUMER_BATCH_SIZE": "a consumer's batch_size attribute (500 unless it sets one).",
        "CONSUMER_LOST_AFTER": "a consumer's lost_after attribute (3 s unless it sets one).",
        "MAX_ATTEMPTS": "a consumer's max_attempts attribute (5 unless it sets one).",
        "RETRY_BACKOFF": "a consumer's retry_backoff attribute (1 s unless it sets one).",
        "RETRY_BACKOFF_MAX": "a consumer's retry_backoff_max attribute (5 minutes unless it "
        "sets one).",
        "RELAY": 'OUTBOX["TRANSPORT"] = None: no relay runs, and retention waits for none.',
        "RELAY_NAME": "relay_outbox --name (default unless given); retention and health "
        "follow every relay that has run.",
        "RELAY_BATCH_SIZE": "relay_outbox --batch-size (1000 unless given).",
        "BROKER_BACKOFF": "the relay's first pause after a broker failure is 0.5 s.",
        "BROKER_BACKOFF_MAX": "the relay's pauses after broker failures grow to 30 s at most.",
        "DATABASE_BACKOFF": "a relay's or consumer's first pause after losing the database is "
        "1 s (doubling up to 30 s).",
        "CELERY_TOPIC_TASKS": 'OUTBOX["CELERY_TASK"] takes the same dict (topic -> task, '
        '"*" for every other topic).',
        "TASKS_TOPIC_TASKS": 'OUTBOX["TASKS_TASK"] takes the same dict (topic -> task, '
        '"*" for every other topic).',
        "TASKS_STALLED_AFTER": "requeue_outbox_tasks --stalled-after (30 s unless given).",
        "CELERY_SEND_TASK": "the Celery transport always publishes through Celery's "
        "send_task_message: Celery's publish signals fire for every message.",
        "RECEIVER_RETRY_BACKOFF": "a receiver's first pause is 1 s, doubling up to "
        'OUTBOX["RECEIVER_RETRY_BACKOFF_MAX"].',
        "RECEIVED_RETENTION": 'receivers remember message ids as long as messages are kept '
        '(OUTBOX["RETENTION"]).',
        "REAP_BATCH_SIZE": "reap_outbox --batch-size (5000 unless given).",
        "HEALTH_MAX_LEASE_AGE": "outbox_health --max-lease-age (10 s unless given).",
    }

    # Each key's meaning, default and when to change it: docs/settings.md.
    CONSUMERS: Setting[tuple[Any, ...]] = Setting((), objects)
    TRANSPORT: Setting[Any] = Setting(
        "outbox.transports.CeleryTransport", optional(dotted_path_or_object)
    )
    RELAY_LEASE = Setting(timedelta(seconds=1), seconds(allow_zero=False))
    POLL_INTERVAL = Setting(0.05, seconds())
    ON_COMMIT: Setting[Any] = Setting(None, optional(dotted_path_or_object))
    CELERY_APP: Setting[Any] = Setting(None, optional(dotted_path_or_object))
    CELERY_TASK: Setting[dict[str, str]] = Setting(None, task_routes)
    CELERY_QUEUE = Setting(None, optional(text()))
    TASKS_TASK: Setting[dict[str, str]] = Setting(None, task_routes)
    RECEIVER_MAX_ATTEMPTS = Setting(10, integer(minimum=1))
    RECEIVER_RETRY_BACKOFF_MAX = Setting(timedelta(minutes=5), seconds())
    SIGNING_KEYS: Setting[tuple[SigningKey, ...]] = Setting((), signing_keys)
    RETENTION = Setting(timedelta(days=7), seconds())
    REPLICATION_SLOT = Setting(None, optional(text(max_length=63)))
    HEALTH_MAX_LAG = Setting(timedelta(seconds=60), seconds(allow_zero=False))


outbox_settings = OutboxSettings()
