"""The ``IDEMPOTENCY`` settings dict and its defaults (documented in docs/settings.md)."""

from __future__ import annotations

from datetime import timedelta

from django_idempotency_outbox.conf import (
    AppSettings,
    Setting,
    boolean,
    duration,
    http_status,
    http_statuses,
    integer,
    seconds,
    text,
    texts,
)
from django_idempotency_outbox.durations import as_timedelta

__all__ = ["IdempotencySettings", "as_timedelta", "idempotency_settings"]


class IdempotencySettings(AppSettings):
    namespace = "IDEMPOTENCY"
    removed = {
        "ADMIN_DATABASE": 'moved to TENANCY["ADMIN_DATABASE"], with the other aliases.',
    }

    #: The request header that carries the key.
    HEADER = Setting("Idempotency-Key", text())
    #: Whether views with the mixin answer 400 to an unsafe request without a key.
    REQUIRED = Setting(True, boolean)
    #: How long a finished key is replayed (timedelta or seconds).
    TTL = Setting(timedelta(hours=24), duration())
    #: Longest accepted key, in characters.
    MAX_KEY_LENGTH = Setting(255, integer(minimum=1, maximum=255))
    #: Deepest nesting of arrays and objects accepted in a keyed request's body;
    #: deeper is a 400 (body_too_deep) before the key is looked up.
    MAX_BODY_DEPTH = Setting(100, integer(minimum=1, maximum=500))
    #: Phases mode: the most bytes of request data (the fields a program
    #: declares, URL arguments, principal) stored with a pending key; more is a 413.
    MAX_STORED_DATA = Setting(64 * 1024, integer(minimum=1024))
    #: Status codes of the answers the library gives itself.
    STATUS_KEY_MISSING = Setting(400, http_status)
    STATUS_KEY_INVALID = Setting(400, http_status)
    STATUS_MISMATCH = Setting(422, http_status)
    STATUS_IN_PROGRESS = Setting(409, http_status)
    #: Seconds advertised in Retry-After with the in-progress answer.
    RETRY_AFTER = Setting(1, integer(minimum=0))
    #: Seconds to wait for a duplicate in flight before answering in-progress;
    #: 0 answers at once (the IETF draft's behaviour). When the first request
    #: finishes within the wait, its answer is replayed.
    IN_PROGRESS_WAIT = Setting(0.0, seconds())
    #: Answers that are neither stored nor replayed, besides every 5xx: the
    #: handler's writes are rolled back and a retry runs again.
    UNSTORED_STATUS_CODES = Setting(
        frozenset({401, 403, 404, 408, 409, 425, 429}), http_statuses
    )
    #: Response headers stored with the answer and replayed.
    REPLAYED_HEADERS = Setting(("Content-Type", "Location"), texts)
    #: Phases mode: how long a run owns a pending key before a retry (or the
    #: completer) may take it over. Each committed phase renews it.
    LEASE = Setting(timedelta(seconds=30), duration())
    #: The completer finishes pending keys of completable programs that nobody
    #: has touched for this long (and whose lease has run out).
    COMPLETE_AFTER = Setting(timedelta(minutes=5), duration())
    #: Keys the completer takes per run.
    COMPLETE_BATCH_SIZE = Setting(100, integer(minimum=1))
    #: Failed completer runs of one key after which the completer gives up on
    #: it: the key is finished with the "abandoned" answer (STATUS_ABANDONED).
    COMPLETE_MAX_ATTEMPTS = Setting(10, integer(minimum=1))
    #: The reaper gives up on pending keys that nothing has touched for this
    #: long (any program, completable or not, or none): finished with the
    #: "abandoned" answer, then reaped after their TTL like any finished key.
    GIVE_UP_AFTER = Setting(timedelta(hours=72), duration())
    #: The status of the answer stored for a request given up on (problem+json,
    #: code "idempotency_request_abandoned"), replayed to every retry.
    STATUS_ABANDONED = Setting(500, http_status)
    #: Unfinished keys older than this are reported by the reaper.
    STUCK_AFTER = Setting(timedelta(hours=1), duration())
    #: Rows deleted per reaper transaction, and the pause between two: the
    #: reaper's share of the server, so that live traffic barely notices it.
    REAP_BATCH_SIZE = Setting(100, integer(minimum=1))
    REAP_PAUSE = Setting(0.01, seconds())
    #: How long the reaper's lease (a row, by the database clock) lasts without
    #: renewal; it is renewed before every batch. A reaper that dies blocks the
    #: next one for at most this long.
    REAP_LEASE = Setting(60.0, seconds(allow_zero=False))


idempotency_settings = IdempotencySettings()
