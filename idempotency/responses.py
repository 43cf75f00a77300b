"""HTTP answers of the contract, given by :mod:`idempotency.flow` for the mixin and the decorator.

The library's own errors are RFC 9457 problem details
(:mod:`django_idempotency_outbox.problems`, shared with ``tenancy``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpResponse

from django_idempotency_outbox.problems import PROBLEM_CONTENT_TYPE, problem_response
from idempotency import core
from idempotency.conf import RETRY_AFTER, idempotency_settings

__all__ = [
    "PROBLEM_CONTENT_TYPE",
    "REPLAYED_HEADER",
    "answer",
    "http_response",
    "problem_response",
    "replay_response",
    "to_stored_response",
]

REPLAYED_HEADER = "Idempotent-Replayed"


def to_stored_response(response: HttpResponse) -> core.StoredResponse:
    """The part of a rendered response that is stored and replayed."""
    names = idempotency_settings.REPLAYED_HEADERS
    headers = tuple((name, response[name]) for name in names if response.has_header(name))
    return core.StoredResponse(response.status_code, bytes(response.content), headers)


def http_response(stored: core.StoredResponse) -> HttpResponse:
    """An HttpResponse with exactly the stored status, body and headers."""
    response = HttpResponse(stored.body, status=stored.status_code)
    del response["Content-Type"]  # only the stored Content-Type, if any
    for name, value in stored.headers:
        response[name] = value
    return response


def replay_response(stored: core.StoredResponse) -> HttpResponse:
    """The stored answer again, marked ``Idempotent-Replayed: true``."""
    response = http_response(stored)
    response[REPLAYED_HEADER] = "true"
    return response


def answer(
    result: core.Result[Any],
    replay: Callable[[core.StoredResponse], HttpResponse] = replay_response,
) -> HttpResponse:
    """The HTTP answer for a :class:`core.Result`."""
    s = idempotency_settings
    if result.outcome is core.Outcome.EXECUTED:
        return result.value  # type: ignore[return-value]
    if result.outcome is core.Outcome.REPLAYED:
        assert result.stored is not None
        return replay(result.stored)
    if result.outcome is core.Outcome.MISMATCH:
        return problem_response(
            s.STATUS_MISMATCH,
            "idempotency_key_reused",
            "This idempotency key was already used for a different request.",
        )
    return problem_response(
        s.STATUS_IN_PROGRESS,
        "idempotency_key_in_progress",
        "A request with this idempotency key is still being processed; retry later.",
        headers={"Retry-After": str(RETRY_AFTER)},
    )
