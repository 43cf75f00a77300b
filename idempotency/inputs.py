"""What the library refuses of a keyed request before it looks the key up.

Each check raises :class:`~idempotency.exceptions.RequestRefused`, answered
as ``application/problem+json`` with nothing looked up or written, in this
order: :func:`check_size` (413 by ``Content-Length``, before a byte is read:
DRF's JSON parser reads whatever comes), :func:`check_path` (400, a NUL),
:func:`parsed` (Django's limits as 413s, JSON nested past the parser's
recursion as a 400), :func:`check_body` (400: deeper than
``MAX_BODY_DEPTH``, a lone surrogate or a NUL, which PostgreSQL's text and
``jsonb`` cannot hold) and, in phases mode, :func:`check_storable` (the data
stored with the key: 400 for a NUL, 413 past ``MAX_STORED_DATA``).
docs/mixin.md lists every status.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest

from django_idempotency_outbox.problems import CONTENT_TOO_LARGE, size_problem
from idempotency.conf import MAX_BODY_DEPTH, MAX_STORED_DATA
from idempotency.exceptions import RequestRefused

T = TypeVar("T")

BAD_REQUEST = 400

_SURROGATE = re.compile("[\ud800-\udfff]")


def check_size(request: HttpRequest) -> None:
    """Refuse a body whose ``Content-Length`` exceeds ``DATA_UPLOAD_MAX_MEMORY_SIZE``.

    A multipart body is left to Django's parser, which counts its fields but
    not its files (uploads go to disk past ``FILE_UPLOAD_MAX_MEMORY_SIZE``).
    """
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is None or (request.content_type or "").startswith("multipart/"):
        return
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return  # the server refuses such a request before Django sees it
    if length > limit:
        raise too_large(f"The request body is larger than {limit} bytes.")


def too_large(detail: str, code: str = "body_too_large") -> RequestRefused:
    return RequestRefused(CONTENT_TOO_LARGE, code, detail)


def check_path(path: str) -> None:
    """Refuse a path with a NUL character (``%00``), which no text column can hold."""
    if "\x00" in path:
        raise RequestRefused(
            BAD_REQUEST, "path_invalid", "The request path contains a NUL character (%00)."
        )


def parsed(read: Callable[[], T]) -> T:
    """Call ``read`` (which parses the body), turning the parser's limits into refusals."""
    try:
        return read()
    except (RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent) as exc:
        status, code, detail = size_problem(exc)  # type: ignore[misc]
        raise RequestRefused(status, code, detail) from None
    except RecursionError:
        raise too_deep() from None


def too_deep() -> RequestRefused:
    depth = MAX_BODY_DEPTH
    return RequestRefused(
        BAD_REQUEST, "body_too_deep", f"The request body is nested more than {depth} levels deep."
    )


def check_body(data: Any) -> None:
    """Refuse a parsed body nested deeper than ``MAX_BODY_DEPTH``, or with text no column holds.

    Iterative: any depth a parser returns is measured, not recursed into.
    Strings are checked in object keys and values alike.
    """
    limit = MAX_BODY_DEPTH
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
        elif isinstance(value, Mapping):
            if depth >= limit:
                raise too_deep()
            for name, member in value.items():
                if isinstance(name, str):
                    _check_text(name)
                stack.append((member, depth + 1))
        elif isinstance(value, list | tuple):
            if depth >= limit:
                raise too_deep()
            stack.extend((member, depth + 1) for member in value)


def _check_text(text: str) -> None:
    if "\x00" in text:
        raise RequestRefused(
            BAD_REQUEST,
            "body_invalid_text",
            "The request body has a NUL character (\\u0000), which no text column can hold.",
        )
    if not text.isascii() and _SURROGATE.search(text):
        raise RequestRefused(
            BAD_REQUEST,
            "body_invalid_text",
            "The request body has a string that is not Unicode text (a lone surrogate such "
            "as \\ud800).",
        )


def check_storable(data: Any) -> None:
    """Refuse ``data`` (to be stored with a pending key) over ``MAX_STORED_DATA`` or with a NUL.

    The size is that of its JSON text with every non-ASCII character escaped.
    """
    text = json.dumps(data, cls=DjangoJSONEncoder, separators=(",", ":"))
    limit = MAX_STORED_DATA
    if len(text) > limit:  # ensure_ascii: one character is one byte
        raise too_large(
            f"The data this operation keeps to resume is larger than {limit} bytes.",
            "stored_data_too_large",
        )
    if "\\u0000" in text and _has_nul(data):
        raise RequestRefused(
            BAD_REQUEST,
            "body_invalid_text",
            "The request has a NUL character (\\u0000) in data this operation keeps to resume.",
        )


def _has_nul(data: Any) -> bool:
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return True
        elif isinstance(value, Mapping):
            stack.extend(str(name) for name in value)
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
    return False
