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

_UNREAD = object()


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
    methods need no key and run as the tenant too (a request without one is
    answered 403, as ``tenant_scoped`` answers it). An exception from the view
    rolls everything back and propagates.
    """
    ttl_delta = None if ttl is None else as_timedelta(ttl, "ttl")

    def decorator(view: View) -> View:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            return flow.respond(_PlainView(request, view, args, kwargs, scope, ttl_delta,
                                           required, wait))

        return wrapper

    return decorator


class _PlainView(flow.KeyedView):
    """A plain Django view as :func:`idempotency.flow.respond` sees it."""

    def __init__(self, request: HttpRequest, view: View, args: Any, kwargs: dict[str, Any],
                 scope: str, ttl: timedelta | None, required: bool | None,
                 wait: float | None) -> None:
        super().__init__(request)
        self.view, self.args, self.kwargs, self._scope = view, args, kwargs, scope
        self.ttl, self.required, self.wait = ttl, required, wait
        self._body: Any = _UNREAD

    def scope(self) -> str:
        return self._scope

    def body(self) -> Any:
        """Parsed once: checked, then fingerprinted."""
        if self._body is _UNREAD:
            self._body = parsed_body(self.request)
        return self._body

    def fingerprint(self) -> str:
        request = self.request
        method = request.method or "POST"
        path = canonical_path(request.path, request.META.get("QUERY_STRING", ""))
        principal = principal_of(getattr(request, "user", None))
        return fingerprint(method, path, principal, self.body())

    def run(self) -> HttpResponse:
        return self.view(self.request, *self.args, **self.kwargs)

    def run_keyed(self) -> HttpResponse:
        response = self.run()
        if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
            response.render()
        return response
