"""Django REST framework's errors as RFC 9457 problem details, like the library's own.

Opt in, in your settings::

    REST_FRAMEWORK = {
        ...,
        "EXCEPTION_HANDLER": "django_idempotency_outbox.drf.exception_handler",
    }

Every error DRF answers itself (validation, authentication, permission, 404,
throttling, parse errors, 405, 406, 415) is then ``application/problem+json``
with the same members as the library's answers: ``type``, ``title`` (the
RFC 9110 reason phrase), ``status``, ``detail`` and a stable ``code``: the
exception's code (``not_found``, ``not_authenticated``, ``throttled``...),
or, for a validation error, its class's ``default_code`` (``invalid`` for
DRF's ``ValidationError``; a subclass names its own). A validation error
keeps DRF's usual body, field by field, in ``errors``. Headers DRF sets
stay (``WWW-Authenticate``, ``Retry-After``).

Django's request size errors (``RequestDataTooBig``, ``TooManyFieldsSent``,
``TooManyFilesSent``), which DRF leaves to Django's HTML 400 page, become
``413`` problems (codes ``body_too_large``, ``too_many_fields``,
``too_many_files``). Anything else is left to Django, as DRF leaves it.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from rest_framework import exceptions
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from django_idempotency_outbox.problems import problem_response, size_problem

__all__ = ["exception_handler"]


def exception_handler(exc: Exception, context: dict[str, Any]) -> HttpResponse | None:
    """DRF's ``EXCEPTION_HANDLER``: DRF's answer, as a problem (None: not DRF's to answer)."""
    response = drf_exception_handler(exc, context)
    if response is None:
        size = size_problem(exc)
        if size is None:
            return None
        set_rollback()
        return problem_response(*size)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(*exc.args)
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(*exc.args)
    assert isinstance(exc, exceptions.APIException)
    headers = {name: value for name, value in response.items() if name != "Content-Type"}
    detail = exc.detail
    if isinstance(detail, list | dict):
        code = str(exc.default_code)
        message = str(exc.default_detail)
        if isinstance(detail, list) and len(detail) == 1 and isinstance(detail[0], str):
            message = str(detail[0])  # ValidationError("...") of the whole request
        return problem_response(
            response.status_code, code, message, headers, extra={"errors": response.data}
        )
    code = getattr(detail, "code", None) or exc.default_code
    return problem_response(response.status_code, str(code), str(detail), headers)
