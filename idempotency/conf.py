"""The ``IDEMPOTENCY`` settings dict and its defaults (documented in docs/settings.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tenancy.conf import AppSettings

DEFAULTS: dict[str, Any] = {
    # The request header that carries the key.
    "HEADER": "Idempotency-Key",
    # Whether views with the mixin answer 400 to an unsafe request without a key.
    "REQUIRED": True,
    # How long a finished key is replayed (timedelta or seconds).
    "TTL": timedelta(hours=24),
    # Longest accepted key, in characters.
    "MAX_KEY_LENGTH": 255,
    # Status codes of the answers the library gives itself.
    "STATUS_KEY_MISSING": 400,
    "STATUS_KEY_INVALID": 400,
    "STATUS_MISMATCH": 422,
    "STATUS_IN_PROGRESS": 409,
    "STATUS_NO_TENANT": 403,
    # Seconds advertised in Retry-After with the in-progress answer.
    "RETRY_AFTER": 1,
    # Seconds to wait for a duplicate in flight before answering in-progress;
    # 0 answers at once (the IETF draft's behaviour). When the first request
    # finishes within the wait, its answer is replayed.
    "IN_PROGRESS_WAIT": 0,
    # Answers that are neither stored nor replayed, besides every 5xx: the
    # handler's writes are rolled back and a retry runs again.
    "UNSTORED_STATUS_CODES": (401, 403, 404, 408, 409, 425, 429),
    # Response headers stored with the answer and replayed.
    "REPLAYED_HEADERS": ("Content-Type", "Location"),
    # Phases mode: how long a run owns a pending key before a retry (or the
    # completer) may take it over. Each committed phase renews it.
    "LEASE": timedelta(seconds=30),
    # The completer finishes pending keys of completable programs that nobody
    # has touched for this long (and whose lease has run out).
    "COMPLETE_AFTER": timedelta(minutes=5),
    # Keys the completer takes per run.
    "COMPLETE_BATCH_SIZE": 100,
    # Unfinished keys older than this are reported by the reaper.
    "STUCK_AFTER": timedelta(hours=1),
    # The alias the admin lists keys through (every tenant's). None: the
    # system alias. Better: a role of its own with BYPASSRLS and SELECT only.
    "ADMIN_DATABASE": None,
    # Rows deleted per reaper transaction, and the pause between two: the
    # reaper's share of the server, so that live traffic barely notices it.
    "REAP_BATCH_SIZE": 100,
    "REAP_PAUSE": 0.01,
}

idempotency_settings = AppSettings("IDEMPOTENCY", DEFAULTS)


def as_timedelta(value: timedelta | int | float, name: str) -> timedelta:
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = timedelta(seconds=value)
    else:
        raise TypeError(f"{name} must be a timedelta or a number of seconds, not {value!r}")
    if result <= timedelta(0):
        raise ValueError(f"{name} must be positive, not {value!r}")
    return result
