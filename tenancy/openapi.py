"""The no-tenant answer in the OpenAPI schema of ``TenantScopedViewMixin`` views (drf-spectacular).

Registered by ``TenancyConfig.ready()`` when drf-spectacular is installed
(see :mod:`django_idempotency_outbox.openapi`).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiViewExtension

from django_idempotency_outbox.openapi import Answer, ProblemAnswersSchema, replace_schema
from tenancy.conf import tenancy_settings
from tenancy.mixins import TenantScopedViewMixin


def no_tenant_answer() -> Answer:
    return Answer(
        tenancy_settings.STATUS_NO_TENANT,
        ("tenant_unknown",),
        "The request belongs to no tenant; nothing ran",
    )


class TenantScopedSchema(ProblemAnswersSchema):
    """Adds the no-tenant answer to the operations of a tenant-scoped view."""

    def problem_answers(self) -> list[Answer]:
        answers = super().problem_answers()
        if self.needs_tenant():
            answers.append(no_tenant_answer())
        return answers

    def needs_tenant(self) -> bool:
        view: Any = self.view
        return bool(view._needs_tenant(_MethodOnly(self.method)))


class _MethodOnly:
    """What ``_needs_tenant()`` reads of a request, at schema generation."""

    def __init__(self, method: str) -> None:
        self.method = method


# drf-spectacular's OpenApiViewExtension.__init_subclass__ (the registration) is unannotated
class TenantScopedViewExtension(OpenApiViewExtension):  # type: ignore[no-untyped-call]
    """Documents ``TenantScopedViewMixin``'s answers on every view that uses it."""

    # The class, not its dotted path: drf-spectacular imports a path on first use,
    # in whichever request generates a schema first, and two threads doing so at
    # once (a gthread worker's first concurrent /schema/ requests) overwrite each
    # other's half-loaded value and answer 500.
    target_class = TenantScopedViewMixin
    match_subclasses = True

    def view_replacement(self) -> type:
        return replace_schema(self.target, TenantScopedSchema)
