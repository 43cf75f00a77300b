"""The OpenAPI schema of the library's answers, for drf-spectacular (the ``[spectacular]`` extra).

drf-spectacular documents what a view's own code answers, not the answers the library gives
around it (a missing key, a request of no tenant...). ``tenancy.openapi`` and
``idempotency.openapi`` register view extensions that replace the view, for schema generation
only, by a subclass whose schema class adds them (docs/mixin.md, "The OpenAPI schema"). This
module imports drf-spectacular: only the extension modules import it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from drf_spectacular.plumbing import ComponentRegistry, ResolvedComponent, get_class
from rest_framework.permissions import AllowAny
from rest_framework.settings import api_settings

from django_idempotency_outbox.problems import PROBLEM_CONTENT_TYPE

PROBLEM_COMPONENT = "Problem"

#: RFC 9457 problem details as the library writes them.
PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": (
        "RFC 9457 problem details. `code` is stable; branch on it rather than on `detail`."
    ),
    "properties": {
        "type": {"type": "string", "description": "`about:blank`: the status says it all."},
        "title": {"type": "string", "description": "The status's RFC 9110 reason phrase."},
        "status": {"type": "integer"},
        "detail": {"type": "string", "description": "What went wrong, for people."},
        "code": {"type": "string", "description": "What went wrong, for programs."},
        "errors": {
            "description": (
                "A validation error's fields and their messages, as Django REST "
                "framework writes them."
            ),
        },
    },
    "required": ["type", "title", "status", "detail", "code"],
}

RETRY_AFTER = {"schema": {"type": "integer", "minimum": 0},
               "description": "Seconds to wait before retrying."}


@dataclass(frozen=True)
class Answer:
    """One answer an operation can give: a problem with one of ``codes``."""

    status: int
    codes: tuple[str, ...]
    description: str
    headers: dict[str, dict[str, Any]] = field(default_factory=dict)


def problem_ref(registry: ComponentRegistry) -> dict[str, Any]:
    # drf-spectacular's ResolvedComponent.__init__ is unannotated
    component = ResolvedComponent(  # type: ignore[no-untyped-call]
        name=PROBLEM_COMPONENT,
        type=ResolvedComponent.SCHEMA,
        object=PROBLEM_COMPONENT,
        schema=PROBLEM_SCHEMA,
    )
    registry.register_on_missing(component)
    return component.ref


def add_answers(
    operation: dict[str, Any], registry: ComponentRegistry, answers: Iterable[Answer]
) -> None:
    """Merge ``answers`` into ``operation["responses"]``, keeping what the view documented.

    Answers of one status are listed in one response, each code once.
    """
    responses = operation.setdefault("responses", {})
    ref = problem_ref(registry)
    listed: dict[int, set[str]] = {}
    for answer in answers:
        seen = listed.setdefault(answer.status, set())
        codes = [code for code in answer.codes if code not in seen]
        seen.update(codes)
        response = responses.setdefault(str(answer.status), {})
        response.setdefault("content", {}).setdefault(PROBLEM_CONTENT_TYPE, {"schema": ref})
        if answer.headers:
            response.setdefault("headers", {}).update(answer.headers)
        if not codes:
            continue
        named = ", ".join(f"`{code}`" for code in codes)
        line = f"{answer.description} (problem, code {named})"
        described = response.get("description") or ""
        if not described or described == "No response body":
            response["description"] = line
        elif line not in described:
            response["description"] = f"{described}; {line}"


def problem(description: str) -> Any:
    """An ``@extend_schema`` response of the view's own that is a problem::

        @extend_schema(responses={
            201: OrderSerializer,
            (402, "application/problem+json"): problem("The card was declined"),
        })
    """
    from drf_spectacular.utils import OpenApiResponse

    return OpenApiResponse(
        {"$ref": f"#/components/schemas/{PROBLEM_COMPONENT}"}, description=description
    )


def add_header_to_responses(
    operation: dict[str, Any], name: str, header: dict[str, Any], statuses: Iterable[str]
) -> None:
    for status in statuses:
        response = operation.get("responses", {}).get(status)
        if response is not None:
            response.setdefault("headers", {})[name] = header


def problem_handler_installed() -> bool:
    """Whether DRF's errors are problems (the library's exception handler is DRF's)."""
    from django_idempotency_outbox.drf import exception_handler

    return api_settings.EXCEPTION_HANDLER is exception_handler


BODY_METHODS = ("POST", "PUT", "PATCH")


def drf_answers(schema: Any) -> list[Answer]:
    """DRF's own errors that ``schema``'s operation can give, as the exception handler writes them.

    Authentication (401, or 403 where the first authenticator names no
    ``WWW-Authenticate`` scheme), permissions (403), a lookup in the path or a
    paginated list (404), content negotiation (406), a body (400 parse and
    validation errors, 413 size limits, 415), throttles (429).
    """
    view = schema.view
    method = schema.method
    answers: list[Answer] = []
    authenticators = list(getattr(view, "authentication_classes", ()))
    permissions = list(getattr(view, "permission_classes", ()))
    guarded = any(get_class(p) is not AllowAny for p in permissions)
    if authenticators:
        first = authenticators[0]()
        auth_status = 401 if first.authenticate_header(None) else 403
        codes = (("not_authenticated",) if guarded else ()) + ("authentication_failed",)
        scheme = {"schema": {"type": "string"}, "description": "The authentication scheme to use."}
        headers = {"WWW-Authenticate": scheme} if auth_status == 401 else {}
        answers.append(Answer(auth_status, codes, "Not authenticated", headers))
    if guarded:
        answers.append(Answer(403, ("permission_denied",), "Not allowed"))
    has_lookup = "{" in schema.path
    paginated = getattr(view, "action", None) == "list" and getattr(view, "pagination_class", None)
    if has_lookup or paginated:
        answers.append(Answer(404, ("not_found",), "Not found"))
    answers.append(Answer(406, ("not_acceptable",), "No acceptable representation"))
    if method in BODY_METHODS:
        answers.append(Answer(400, ("parse_error", "invalid"), "Malformed or invalid body"))
        answers.append(Answer(413, ("body_too_large", "too_many_fields", "too_many_files"),
                              "Body over Django's size limits"))
        answers.append(Answer(415, ("unsupported_media_type",), "Unsupported body media type"))
    if getattr(view, "throttle_classes", ()):
        throttled = Answer(429, ("throttled",), "Too many requests", {"Retry-After": RETRY_AFTER})
        answers.append(throttled)
    return answers


class ProblemAnswersSchema:
    """Adds :meth:`problem_answers` to each operation of a drf-spectacular ``AutoSchema``.

    Mixed in before the view's own schema class, so ``@extend_schema`` and a
    project's ``AutoSchema`` keep working; what they document is kept, and the
    library's answers are merged in.
    """

    view: Any
    method: str
    #: The statuses the view documents itself (before the library's are merged).
    own_statuses: frozenset[str] = frozenset()

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation = super().get_operation(*args, **kwargs)  # type: ignore[misc]
        if operation is None:
            return None
        registry = kwargs.get("registry") or args[4]
        self.own_statuses = frozenset(operation.get("responses", {}))
        answers = list(self.problem_answers())
        if problem_handler_installed():
            answers = drf_answers(self) + answers
        add_answers(operation, registry, answers)
        self.finish_operation(operation)
        return operation  # type: ignore[no-any-return]

    def problem_answers(self) -> list[Answer]:
        """The library's answers to this operation (``self.method`` on ``self.view``)."""
        return []

    def finish_operation(self, operation: dict[str, Any]) -> None:
        """Last changes to the operation (parameters, headers of the view's own answers)."""


def replace_schema(view_class: type, schema_mixin: type) -> type:
    """A subclass of ``view_class`` whose schema class is ``schema_mixin`` over the view's own.

    Methods that ``@extend_schema`` decorated carry a schema class of their
    own, built over the view's original one; the subclass wraps each of them
    with that class rebuilt over the new one, so both apply.
    """
    base = get_class(view_class.schema)  # type: ignore[attr-defined]
    if issubclass(base, schema_mixin):
        schema_class = base
    else:
        schema_class = type(f"{schema_mixin.__name__}{base.__name__}", (schema_mixin, base), {})
    attributes: dict[str, Any] = {
        "schema": schema_class(),
        "__module__": view_class.__module__,
        "__qualname__": view_class.__qualname__,
        "__doc__": view_class.__doc__,
    }
    for name in dir(view_class):
        method = getattr(view_class, name, None)
        method_schema = getattr(method, "kwargs", None)
        if not callable(method) or not isinstance(method_schema, dict):
            continue
        if "schema" not in method_schema:
            continue
        own = get_class(method_schema["schema"])
        if issubclass(own, schema_class):
            continue
        mro = tuple(c for c in own.__mro__ if c not in base.__mro__) + schema_class.__mro__
        attributes[name] = _with_schema(method, type(own.__name__, mro, {}))
    return type(view_class.__name__, (view_class,), attributes)


def _with_schema(method: Any, schema_class: type) -> Any:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    wrapper.kwargs = {**method.kwargs, "schema": schema_class}  # type: ignore[attr-defined]
    return wrapper
