"""RFC 9457 problem details: the library's own HTTP error answers.

Every answer the library gives itself (a missing key, a key reused for
another request, a request that belongs to no tenant...) is one of these:
``type`` is ``about:blank``, so ``title`` is the status's reason phrase, and
a stable ``code`` member lets clients branch without parsing ``detail``.

A project can answer every other error in the same format: DRF's with
:func:`django_idempotency_outbox.drf.exception_handler`, and Django's own
(a URL that matches no view, a request refused before any view) with the
handlers here, set in the root URLconf::

    handler400 = "django_idempotency_outbox.problems.bad_request"
    handler403 = "django_idempotency_outbox.problems.permission_denied"
    handler404 = "django_idempotency_outbox.problems.page_not_found"
    handler500 = "django_idempotency_outbox.problems.server_error"
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpRequest, HttpResponse

PROBLEM_CONTENT_TYPE = "application/problem+json"

#: Reason phrases that RFC 9110 renamed. Python's ``http.HTTPStatus`` has the
#: new names only from 3.13 on; the library answers with the same words on
#: every Python it supports.
_RFC9110_PHRASES = {
    413: "Content Too Large",
    414: "URI Too Long",
    416: "Range Not Satisfiable",
    422: "Unprocessable Content",
}


def reason_phrase(status: int) -> str:
    """The RFC 9110 reason phrase of ``status`` ("Error" for an unregistered code)."""
    if status in _RFC9110_PHRASES:
        return _RFC9110_PHRASES[status]
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_response(
    status: int,
    code: str,
    detail: str,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> HttpResponse:
    """An ``application/problem+json`` answer; the status line carries the same title.

    ``extra`` adds members (e.g. ``errors``, a validation error's fields).
    """
    title = reason_phrase(status)
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code}
    body.update(extra or {})
    response = HttpResponse(
        json.dumps(body, separators=(",", ":")),
        status=status,
        content_type=PROBLEM_CONTENT_TYPE,
        reason=title,
    )
    for name, value in (headers or {}).items():
        response[name] = value
    return response


#: The status of an answer to a request over one of Django's size limits
#: (RFC 9110's "Content Too Large").
CONTENT_TOO_LARGE = 413


def size_problem(exc: BaseException) -> tuple[int, str, str] | None:
    """``(status, code, detail)`` for Django's request size errors, None for any other.

    Django raises them while reading a body past ``DATA_UPLOAD_MAX_MEMORY_SIZE``
    (``RequestDataTooBig``), ``DATA_UPLOAD_MAX_NUMBER_FIELDS``
    (``TooManyFieldsSent``) or ``DATA_UPLOAD_MAX_NUMBER_FILES``
    (``TooManyFilesSent``); left alone they are Django's HTML 400 page.
    """
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        detail = f"The request body is larger than {limit} bytes."
        return CONTENT_TOO_LARGE, "body_too_large", detail
    if isinstance(exc, TooManyFieldsSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        detail = f"The request has more than {limit} form fields."
        return CONTENT_TOO_LARGE, "too_many_fields", detail
    if isinstance(exc, TooManyFilesSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FILES
        return CONTENT_TOO_LARGE, "too_many_files", f"The request has more than {limit} files."
    return None


# --- Django's error views (handler400, handler403, handler404, handler500) ---------


def bad_request(request: HttpRequest, exception: BaseException | None = None) -> HttpResponse:
    """``handler400``: a request Django refused (a bad Host, a size limit) before any view."""
    size = size_problem(exception) if exception is not None else None
    if size is not None:
        return problem_response(*size)
    return problem_response(400, "bad_request", "The request is malformed.")


def permission_denied(request: HttpRequest, exception: BaseException | None = None) -> HttpResponse:
    """``handler403``: Django's ``PermissionDenied`` outside DRF's views."""
    return problem_response(403, "permission_denied", "You may not do this.")


def page_not_found(request: HttpRequest, exception: BaseException | None = None) -> HttpResponse:
    """``handler404``: no view matches the URL (or a view outside DRF raised ``Http404``)."""
    return problem_response(404, "not_found", "Nothing is found at this URL.")


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: an unhandled exception (its traceback goes to the logs, not the client)."""
    return problem_response(500, "server_error", "The server failed to answer; retry later.")
