"""The ``IDEMPOTENCY`` settings dict and its defaults (documented in docs/settings.md).

Below the settings, the fixed values: what earlier releases made settings
and no deployment had a reason to change. ``manage.py check`` reports each
such key still set (``idempotency.E091``), naming what replaces it.
"""

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
    texts,
)
from django_idempotency_outbox.durations import as_timedelta

__all__ = ["IdempotencySettings", "as_timedelta", "idempotency_settings"]

# --- fixed values ------------------------------------------------------------------

#: The request header that carries the key: the IETF draft's name.
HEADER = "Idempotency-Key"
#: The longest key, in characters: the width of its column.
MAX_KEY_LENGTH = 255
#: The deepest nesting of arrays and objects accepted in a keyed request's
#: body; deeper is a 400 (body_too_deep) before the key is looked up. Far past
#: any real document, far below what would exhaust Python's recursion limit
#: when such data is rendered back.
MAX_BODY_DEPTH = 100
#: Phases mode: the most bytes of request data (the fields a program
#: declares, URL arguments, principal) stored with a pending key; more is a 413.
MAX_STORED_DATA = 64 * 1024
#: The status of a missing and of an invalid key (the IETF draft's).
STATUS_KEY_MISSING = 400
STATUS_KEY_INVALID = 400
#: Seconds advertised in Retry-After with the in-progress answer.
RETRY_AFTER = 1
#: Phases mode: how long a run owns a pending key unless its program sets
#: ``lease``; each committed phase renews it.
LEASE = timedelta(seconds=30)
#: Keys the completer takes per run (``complete_idempotency_keys --limit``).
COMPLETE_BATCH_SIZE = 100
#: The status of the answer stored for a request given up on (problem+json,
#: code "idempotency_request_abandoned"), replayed to every retry.
STATUS_ABANDONED = 500
#: Pending keys that nothing has worked on for this long are reported stuck
#: (the reaper's report, the admin's filter).
STUCK_AFTER = timedelta(hours=1)
#: The reaper: rows deleted per transaction (``--batch-size``) and the pause
#: between two (``--pause``), its share of the server: with these it deletes
#: about 6,800 keys a second on two cores while live traffic barely notices.
REAP_BATCH_SIZE = 100
REAP_PAUSE = 0.01
#: The key reaper's lease, renewed before every batch: a reaper that died
#: holds the next one back for at most this long.
REAP_LEASE = 60.0


class IdempotencySettings(AppSettings):
    """The keys a deployment may change, each for a reason docs/settings.md gives."""

    namespace = "IDEMPOTENCY"
    removed = {
        "ADMIN_DATABASE": 'moved to TENANCY["ADMIN_DATABASE"], with the other aliases.',
        "HEADER": f"the key is read from the {HEADER} header, the IETF draft's name.",
        "MAX_KEY_LENGTH": (
            f"a key is at most {MAX_KEY_LENGTH} characters (its column's width); a view "
            "that wants shorter keys refuses them in get_idempotency_key()."
        ),
        "MAX_BODY_DEPTH": f"a keyed request's body nests at most {MAX_BODY_DEPTH} levels deep.",
        "MAX_STORED_DATA": (
            f"phases mode stores at most {MAX_STORED_DATA} bytes with a pending key."
        ),
        "STATUS_KEY_MISSING": "a missing key is answered 400, as the IETF draft says.",
        "STATUS_KEY_INVALID": "an invalid key is answered 400, as the IETF draft says.",
        "RETRY_AFTER": (
            f"the in-progress answer says Retry-After: {RETRY_AFTER}; a phases program's "
            "Retry(retry_after=...) sets its own."
        ),
        "LEASE": "a phases program's lease attribute (30 s unless it sets one).",
        "COMPLETE_BATCH_SIZE": "complete_idempotency_keys --limit (100 unless given).",
        "STATUS_ABANDONED": (
            "a request given up on answers 500 (idempotency_request_abandoned)."
        ),
        "STUCK_AFTER": "pending keys nothing works on are reported stuck after an hour.",
        "REAP_BATCH_SIZE": "reap_idempotency_keys --batch-size (100 unless given).",
        "REAP_PAUSE": "reap_idempotency_keys --pause (0.01 s unless given).",
        "REAP_LEASE": "the key reaper's lease lasts 60 s, renewed before every batch.",
    }

    #: Whether views with the mixin answer 400 to an unsafe request without a key.
    REQUIRED = Setting(True, boolean)
    #: How long a finished key is replayed (timedelta or seconds).
    TTL = Setting(timedelta(hours=24), duration())
    #: The answer to a key reused for another request (the draft's 422; some APIs 409).
    STATUS_MISMATCH = Setting(422, http_status)
    #: The answer while the first request with the key runs (409; some APIs 425).
    STATUS_IN_PROGRESS = Setting(409, http_status)
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
    #: The completer finishes pending keys of completable programs that nobody
    #: has touched for this long (and whose lease has run out).
    COMPLETE_AFTER = Setting(timedelta(minutes=5), duration())
    #: Failed completer runs of one key after which the completer gives up on
    #: it: the key is finished with the "abandoned" answer.
    COMPLETE_MAX_ATTEMPTS = Setting(10, integer(minimum=1))
    #: The reaper gives up on pending keys that nothing has touched for this
    #: long (any program, completable or not, or none): finished with the
    #: "abandoned" answer, then reaped after their TTL like any finished key.
    GIVE_UP_AFTER = Setting(timedelta(hours=72), duration())


idempotency_settings = IdempotencySettings()
