"""``@idempotent`` for plain Django views (no DRF)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.template.response import SimpleTemplateResponse

from idempotency import core
from idempotency.conf import as_timedelta, idempotency_settings
from idempotency.fingerprint import canonical_path, fingerprint, principal_of
from idempotency.responses import answer, check_request, to_stored_response
from tenancy import tenant_context
from tenancy.aliases import app_alias

View = Callable[..., HttpResponse]
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def parsed_body(request: HttpRequest) -> Any:
    """What a plain Django request's body contributes to its fingerprint.

    JSON bodies count by their canonical form, form and multipart bodies by
    their fields and file digests, anything else by its bytes.
    """
    content_type = request.content_type or ""
    if content_type.startswith("multipart/") or content_type == "application/x-www-form-urlencoded":
        return {"data": request.POST, "files": request.FILES}
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            return json.loads(request.body or b"null")
        except ValueError:
            return request.body
    return request.body


def idempotent(
    scope: str,
    *,
    ttl: timedelta | int | None = None,
    required: bool | None = None,
    wait: float | None = None,
) -> Callable[[View], View]:
    """Make a plain Django view idempotent, with the same contract as the mixin.

    Example::

        @require_POST
        @idempotent(scope="order.create")
        def create_order(request):
            ...
            return JsonResponse({"id": order.id}, status=201)

    The view runs inside ``tenant_context`` for the tenant returned by
    ``TENANCY["TENANT_RESOLVER"]``, in one transaction with the key row. Safe
    methods pass through untouched. An exception from the view rolls
    everything back and propagates.
    """
    ttl_delta = None if ttl is None else as_timedelta(ttl, "ttl")

    def decorator(view: View) -> View:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method in SAFE_METHODS:
                return view(request, *args, **kwargs)
            must = idempotency_settings.REQUIRED if required is None else required
            checked = check_request(request, required=must)
            if isinstance(checked, HttpResponse):
                return checked
            key, tenant_id = checked
            if key is None:  # optional and absent: run as the tenant, without a key
                with tenant_context(tenant_id, using=app_alias()):
                    return view(request, *args, **kwargs)
            method = request.method or "POST"
            path = canonical_path(request.path, request.META.get("QUERY_STRING", ""))
            body = parsed_body(request)
            ireq = core.IdempotentRequest(
                tenant_id=tenant_id,
                scope=scope,
                key=key,
                fingerprint=fingerprint(
                    method, path, principal_of(getattr(request, "user", None)), body
                ),
                method=method,
                path=request.path,
                ttl=ttl_delta,
            )

            def run() -> HttpResponse:
                response = view(request, *args, **kwargs)
                if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
                    response.render()
                return response

            result = core.execute(
                ireq, run, to_stored_response, wait=wait, using=app_alias()
            )
            return answer(result)

        return wrapper

    return decorator
