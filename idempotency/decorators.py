"""``@idempotent`` for plain Django views (no DRF)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.template.response import SimpleTemplateResponse

from idempotency import flow, inputs
from idempotency.conf import as_timedelta
from idempotency.fingerprints import canonical_path, fingerprint, principal_of

View = Callable[..., HttpResponse]


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
        except RecursionError:  # valid, but deeper than the parser goes
            raise inputs.too_deep() from None
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
            def run() -> HttpResponse:
                return view(request, *args, **kwargs)

            def rendered() -> HttpResponse:
                response = run()
                if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
                    response.render()
                return response

            @functools.cache
            def body() -> Any:  # parsed once: checked, then fingerprinted
                return parsed_body(request)

            def request_fingerprint() -> str:
                method = request.method or "POST"
                path = canonical_path(request.path, request.META.get("QUERY_STRING", ""))
                principal = principal_of(getattr(request, "user", None))
                return fingerprint(method, path, principal, body())

            return flow.respond(
                request,
                run,
                scope=lambda: scope,
                fingerprint=request_fingerprint,
                required=required,
                ttl=ttl_delta,
                wait=wait,
                keyed_view=rendered,
                body=body,
            )

        return wrapper

    return decorator
