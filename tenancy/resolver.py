"""Finding the tenant of a request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpResponse
from django.utils.module_loading import import_string

from django_idempotency_outbox.errors import ConfigurationError
from django_idempotency_outbox.problems import problem_response
from tenancy.conf import tenancy_settings
from tenancy.context import validate_tenant_id

Resolver = Callable[[Any], "int | None"]


def get_resolver() -> Resolver:
    """The callable named by ``TENANCY["TENANT_RESOLVER"]``."""
    path = tenancy_settings.TENANT_RESOLVER
    if path is None:
        raise ConfigurationError(
            'TENANCY["TENANT_RESOLVER"] is not set: name a callable(request) -> int | None '
            "that returns the tenant of an authenticated request."
        )
    if callable(path):
        return path  # type: ignore[no-any-return]
    try:
        return import_string(path)  # type: ignore[no-any-return]
    except ImportError as exc:
        raise ConfigurationError(f'TENANCY["TENANT_RESOLVER"] = {path!r}: {exc}') from exc


def resolve_tenant(request: Any) -> int | None:
    """The tenant of ``request`` (after authentication), or None if it has none."""
    tenant_id = get_resolver()(request)
    return None if tenant_id is None else validate_tenant_id(tenant_id)


def no_tenant_response() -> HttpResponse:
    """The answer to a request whose resolver names no tenant: nothing of the view ran.

    ``application/problem+json`` with code ``tenant_unknown``, status
    ``TENANCY["STATUS_NO_TENANT"]`` (403).
    """
    return problem_response(
        tenancy_settings.STATUS_NO_TENANT,
        "tenant_unknown",
        "The request does not belong to a tenant.",
    )
