"""``@tenant_scoped`` for plain Django views (no DRF)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.template.response import SimpleTemplateResponse

from tenancy.context import tenant_context
from tenancy.resolver import no_tenant_response, resolve_tenant

View = Callable[..., HttpResponse]


def tenant_scoped(view: View) -> View:
    """Run a plain Django view inside ``tenant_context`` for the request's tenant.

    The tenant is ``TENANCY["TENANT_RESOLVER"]``'s answer for the request, as
    authenticated by Django's middleware; none is answered like
    ``TenantScopedViewMixin`` answers it (403 problem+json, ``tenant_unknown``),
    without running the view. A template response is rendered inside the
    context. Example::

        @tenant_scoped
        def order_list(request):
            return JsonResponse({"orders": list(Order.objects.values("id", "sku"))})

    ``idempotency.idempotent`` does this already for the views it decorates.
    """

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        tenant_id = resolve_tenant(request)
        if tenant_id is None:
            return no_tenant_response()
        with tenant_context(tenant_id):
            response = view(request, *args, **kwargs)
            if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
                response.render()
            return response

    return wrapper
