"""The ``Idempotency-Key`` contract in the OpenAPI schema of ``IdempotentViewMixin`` views.

Registered by ``IdempotencyConfig.ready()`` when drf-spectacular is installed
(:mod:`django_idempotency_outbox.openapi`). Each unsafe method of a view with
the mixin gains the key header (the pattern the library accepts, required
where the view requires a key), the library's own answers as problems (400,
403, 409 with ``Retry-After``, 413, 422, each status as configured), and
``Idempotent-Replayed`` on the view's answers that are stored and replayed.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiViewExtension

from django_idempotency_outbox.openapi import (
    BODY_METHODS,
    RETRY_AFTER,
    Answer,
    add_header_to_responses,
    problem_handler_installed,
    replace_schema,
)
from idempotency import core, flow
from idempotency.conf import HEADER, MAX_KEY_LENGTH, STATUS_KEY_INVALID, idempotency_settings
from idempotency.mixins import IdempotentViewMixin
from idempotency.responses import REPLAYED_HEADER
from tenancy.openapi import TenantScopedSchema

REPLAYED = {
    "schema": {"type": "string", "enum": ["true"]},
    "description": "Present on a replay: the stored answer to the first request with this key.",
}


def key_required(view: Any) -> bool:
    """Whether ``view`` answers 400 to an unsafe request without a key."""
    try:
        program = view.get_idempotency_phases()
    except Exception:  # a hook that reads the request, which schema generation lacks
        program = getattr(view, "idempotency_phases", None)
    if program is not None:
        return True
    required = getattr(view, "idempotency_key_required", None)
    return bool(idempotency_settings.REQUIRED if required is None else required)


def uses_phases(view: Any) -> bool:
    try:
        return view.get_idempotency_phases() is not None
    except Exception:
        return getattr(view, "idempotency_phases", None) is not None


def key_parameter(required: bool) -> dict[str, Any]:
    n = MAX_KEY_LENGTH
    return {
        "name": HEADER,
        "in": "header",
        "required": required,
        "description": (
            "One key per operation (a UUID, say), sent again unchanged with every retry of "
            f"it: 1 to {n} printable ASCII characters, as a Structured Field string "
            '(`"8e03978e-40d5"`, with `\\"` and `\\\\` escapes) or bare (no spaces, commas or '
            "quotes). One value only: a repeated header or a list is refused."
            + ("" if required else " Without it, the request runs as a plain request.")
        ),
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": 2 * n + 2,
            "pattern": core.key_pattern(n),
        },
    }


class IdempotentSchema(TenantScopedSchema):
    """Adds the ``Idempotency-Key`` contract to the unsafe operations of an idempotent view."""

    def keyed(self) -> bool:
        return self.method not in flow.SAFE_METHODS

    def problem_answers(self) -> list[Answer]:
        answers = super().problem_answers()
        if not self.keyed():
            return answers
        s = idempotency_settings
        required = key_required(self.view)
        invalid: tuple[str, ...] = ("idempotency_key_invalid",)
        if required:  # one status for both (400, the IETF draft's)
            invalid = ("idempotency_key_missing", *invalid)
        answers.append(Answer(STATUS_KEY_INVALID, invalid, f"Invalid {HEADER} header"))
        answers.append(Answer(
            400, ("body_too_deep", "body_invalid_text", "path_invalid"),
            "Body nested too deeply or not Unicode text, or a NUL in the path; nothing stored",
        ))
        large = ["body_too_large", "too_many_fields", "too_many_files"]
        if uses_phases(self.view):
            large.append("stored_data_too_large")
        answers.append(Answer(413, tuple(large), "Body over the size limits; nothing stored"))
        answers.append(Answer(
            s.STATUS_IN_PROGRESS, ("idempotency_key_in_progress",),
            "A request with this key is still running; retry after Retry-After seconds",
            {"Retry-After": RETRY_AFTER},
        ))
        answers.append(Answer(
            s.STATUS_MISMATCH, ("idempotency_key_reused",),
            "This key was used for a different request (body, method, path or user)",
        ))
        return answers

    def finish_operation(self, operation: dict[str, Any]) -> None:
        super().finish_operation(operation)
        if not self.keyed():
            return
        parameter = key_parameter(key_required(self.view))
        parameters = [
            p for p in operation.get("parameters", [])
            if not (p.get("in") == "header" and p.get("name", "").lower()
                    == parameter["name"].lower())
        ]
        operation["parameters"] = [*parameters, parameter]
        own = set(self.own_statuses)
        if problem_handler_installed() and self.method in BODY_METHODS:
            own.add("400")  # a validation error of the view's, stored as failed
        replayed = [
            status for status in sorted(own)
            if status.isdigit() and core.classify(int(status)) is not core.Verdict.UNSTORED
        ]
        add_header_to_responses(operation, REPLAYED_HEADER, REPLAYED, replayed)


# drf-spectacular's OpenApiViewExtension.__init_subclass__ (the registration) is unannotated
class IdempotentViewExtension(OpenApiViewExtension):  # type: ignore[no-untyped-call]
    """Documents ``IdempotentViewMixin``'s contract on every view that uses it."""

    target_class = IdempotentViewMixin  # the class: see tenancy.openapi
    match_subclasses = True
    priority = 1  # before TenantScopedViewExtension, which also matches these views

    def view_replacement(self) -> type:
        return replace_schema(self.target, IdempotentSchema)
