"""``TenantScopedViewMixin``: every method of a DRF view runs as the request's tenant."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.http import HttpResponse

from tenancy.context import tenant_context, validate_tenant_id
from tenancy.resolver import no_tenant_response, resolve_tenant


class TenantScopedViewMixin:
    """Run a DRF view's method handlers inside ``tenant_context`` for the request's tenant.

    Row-level security shows a query only the rows of the tenant set for its
    transaction, and none when no tenant is set: without this, a ``GET``
    list is empty and a retrieve answers 404. Put the mixin first among the
    bases::

        class ProductViewSet(TenantScopedViewMixin, viewsets.ReadOnlyModelViewSet):
            serializer_class = ProductSerializer
            queryset = Product.objects.all()     # RLS limits it to the tenant

    DRF authenticates inside the view, after every middleware has run, so the
    tenant is resolved here: after authentication, permissions and
    throttling (``initial()``), by :meth:`get_tenant` (by default
    ``TENANCY["TENANT_RESOLVER"]``). Then the method handler, and the
    rendering of its answer, run in one transaction on
    ``TENANCY["APP_DATABASE"]`` with the tenant set. An exception from the
    handler rolls that transaction back before DRF turns it into an answer.

    A request whose resolver names no tenant is answered
    ``TENANCY["STATUS_NO_TENANT"]`` (403) ``application/problem+json`` with
    code ``tenant_unknown``; the handler does not run. A method the view does
    not have is left to DRF (405).

    Attributes:
        tenant_scoped: ``False`` runs the view as if the mixin were not there
            (no resolver, no tenant): for a view that reads no tenant's rows,
            on a base class that every view shares.
        tenant_id: the tenant the handler runs as (set by ``initial()``;
            None when the view is not tenant-scoped).

    ``IdempotentViewMixin`` builds on this mixin: its safe methods run like
    this, and its unsafe ones set the tenant once, inside the key's transaction.
    """

    tenant_scoped: bool = True
    tenant_id: int | None = None

    request: Any
    http_method_names: list[str]

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        self.tenant_id = None
        if not self._needs_tenant(request):
            return
        name = str(request.method).lower()
        handler = getattr(self, name, None) if name in self.http_method_names else None
        if handler is None:
            return  # DRF answers 405, as usual
        tenant_id = self.get_tenant()
        # APIView.dispatch looks the handler up after initial(): replacing it
        # on this instance (a new one per request) wraps exactly this request.
        if tenant_id is None:
            setattr(self, name, _refuse)
            return
        self.tenant_id = validate_tenant_id(tenant_id)
        setattr(self, name, functools.partial(self._run_as_tenant, handler))

    def get_tenant(self) -> int | None:
        """The tenant of ``self.request``, or None; called once, after authentication.

        By default ``TENANCY["TENANT_RESOLVER"]``. Override it in a view that
        finds its tenant elsewhere, e.g. in the URL::

            def get_tenant(self):
                membership = self.request.user.memberships.filter(
                    merchant__slug=self.kwargs["merchant"]).first()
                return membership.merchant_id if membership else None
        """
        return resolve_tenant(self.request)

    def _needs_tenant(self, request: Any) -> bool:
        return self.tenant_scoped

    def _run_as_tenant(
        self, handler: Callable[..., HttpResponse], request: Any, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        assert self.tenant_id is not None
        with tenant_context(self.tenant_id):
            response: HttpResponse = handler(request, *args, **kwargs)
            # Rendering reads too (a serializer's lazy relations, the browsable
            # API's forms): it happens here, as the tenant. DRF finalizes the
            # response again afterwards, which changes nothing.
            response = self.finalize_response(request, response, *args, **kwargs)  # type: ignore[attr-defined]
            if hasattr(response, "render") and not getattr(response, "is_rendered", True):
                response.render()
            return response


def _refuse(request: Any, *args: Any, **kwargs: Any) -> HttpResponse:
    return no_tenant_response()
