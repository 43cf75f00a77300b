"""RFC 9457 problem details: the library's own HTTP error answers.

Every answer the library gives itself (a missing key, a key reused for
another request, a request that belongs to no tenant...) is one of these:
``type`` is ``about:blank``, so ``title`` is the status's reason phrase, and
a stable ``code`` member lets clients branch without parsing ``detail``.
"""

from __future__ import annotations

import json
from http import HTTPStatus

from django.http import HttpResponse

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
    status: int, code: str, detail: str, headers: dict[str, str] | None = None
) -> HttpResponse:
    """An ``application/problem+json`` answer; the status line carries the same title."""
    title = reason_phrase(status)
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code}
    response = HttpResponse(
        json.dumps(body, separators=(",", ":")),
        status=status,
        content_type=PROBLEM_CONTENT_TYPE,
        reason=title,
    )
    for name, value in (headers or {}).items():
        response[name] = value
    return response
