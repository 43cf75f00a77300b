"""``IdempotentViewMixin``: the ``Idempotency-Key`` contract for DRF views."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpResponse
from rest_framework.exceptions import APIException
from rest_framework.request import Request

from idempotency import core, flow, phases
from idempotency.conf import as_timedelta
from idempotency.fingerprints import canonical_path, fingerprint, principal_of
from idempotency.phases import Phases
from idempotency.responses import replay_response, to_stored_response
from tenancy.aliases import app_alias
from tenancy.mixins import TenantScopedViewMixin


class IdempotentViewMixin(TenantScopedViewMixin):
    """Make a DRF view's unsafe methods idempotent under an ``Idempotency-Key``.

    Put it first among the bases::

        class OrderViewSet(IdempotentViewMixin, mixins.CreateModelMixin, GenericViewSet):
            idempotency_scope = "order.create"
            queryset = Order.objects.all()
            serializer_class = OrderSerializer

    Authentication, permissions and throttling run first, as usual; then the
    tenant is found (:meth:`get_tenant`, by default ``TENANCY["TENANT_RESOLVER"]``),
    the key is checked, and the handler runs inside ``tenant_context`` for
    that tenant, in one transaction with the key row and the stored answer:
    the tenant is set once, in the key's transaction. Safe methods need no
    key and run as the tenant too (:class:`tenancy.TenantScopedViewMixin`,
    which this mixin builds on; ``tenant_scoped = False`` leaves them
    without a tenant, while unsafe methods always need one, since keys are
    per tenant).

    Attributes (all optional; ``None`` means "use the setting"):
        idempotency_scope: the operation name keys are unique in; defaults to
            ``<module>.<ViewClass>.<action or method>``.
        idempotency_ttl: how long answers are replayed (timedelta or seconds).
        idempotency_key_required: answer 400 to an unsafe request without a key.
        idempotency_wait: seconds to wait for a duplicate in flight before
            answering 409; when the first finishes in time, its answer is replayed.

    Hooks, in the style of DRF's ``get_*``/``perform_*`` methods:
    :meth:`get_idempotency_key`, :meth:`get_idempotency_scope`,
    :meth:`get_tenant`, :meth:`get_idempotency_principal`,
    :meth:`get_idempotency_fingerprint`, :meth:`perform_replay` and
    :meth:`get_idempotency_phases`. The request flow itself is
    :func:`idempotency.flow.respond`, shared with :func:`idempotency.idempotent`.
    """

    idempotency_scope: str | None = None
    idempotency_ttl: timedelta | int | None = None
    idempotency_key_required: bool | None = None
    idempotency_wait: float | None = None
    idempotency_phases: type[Phases] | None = None

    request: Request

    def _needs_tenant(self, request: Request) -> bool:
        # Keys are per tenant: an unsafe method needs one even when the view
        # opted its safe methods out (tenant_scoped = False).
        return self.tenant_scoped or request.method not in flow.SAFE_METHODS

    def _run_as_tenant(self, handler: Any, request: Request, *args: Any, **kwargs: Any) -> Any:
        if request.method in flow.SAFE_METHODS:
            return super()._run_as_tenant(handler, request, *args, **kwargs)
        # Not inside a tenant_context of our own: the key's transaction opens
        # it, so the tenant is set once, in that transaction.
        return self._run_idempotently(handler, request, *args, **kwargs)

    def _run_idempotently(self, handler: Any, request: Request, *args: Any, **kwargs: Any) -> Any:
        return flow.respond(_DRFView(self, handler, request, args, kwargs))

    def _rendered(self, response: HttpResponse, *args: Any, **kwargs: Any) -> HttpResponse:
        """Finalize and render now: the stored body must be the bytes the client gets."""
        response = self.finalize_response(self.request, response, *args, **kwargs)  # type: ignore[attr-defined]
        if hasattr(response, "render"):
            response.render()
        return response

    def _run_phases(
        self, program: type[Phases], kwargs: dict[str, Any], keyed: core.IdempotentRequest
    ) -> core.Result[core.StoredResponse]:
        def convert(exc: Exception) -> core.StoredResponse | None:
            # What DRF's exception handler answers (its own exceptions, and
            # Django's Http404 and PermissionDenied) becomes that answer,
            # stored or not by status; anything else is a failure.
            if not isinstance(exc, APIException | Http404 | DjangoPermissionDenied):
                return None
            return to_stored_response(self._rendered(self.handle_exception(exc)))  # type: ignore[attr-defined]

        return phases.execute(
            program,
            keyed,
            data=phases.program_data(program, self.request.data),
            kwargs=kwargs,
            principal=self.get_idempotency_principal(),
            on_exception=convert,
            wait=self.idempotency_wait,
            using=app_alias(),
        )

    def _keyed_answer(self, handler: Any, request: Request, args: Any, kwargs: Any) -> HttpResponse:
        """The handler's answer under a key, as DRF would give it, rendered."""
        try:
            response = handler(request, *args, **kwargs)
        except Exception as exc:
            # Unknown exceptions are re-raised here: everything rolls back.
            response = self.handle_exception(exc)  # type: ignore[attr-defined]
        return self._rendered(response, *args, **kwargs)

    # --- hooks -------------------------------------------------------------

    def get_idempotency_phases(self) -> type[Phases] | None:
        """The phases program to run instead of the handler (phases mode), or None.

        By default ``idempotency_phases``. In phases mode the view's method
        (``post``, or the viewset action) only routes the request: the program
        does the work, and its scope is the key's scope.
        """
        return self.idempotency_phases

    def get_idempotency_key(self, header_value: str) -> str:
        """Parse the header value into a key; raise ``core.InvalidKey`` to refuse it."""
        return core.parse_key(header_value)

    def get_idempotency_scope(self) -> str:
        """The operation keys are unique in. Set ``idempotency_scope`` for a name
        that survives renaming the view."""
        if self.idempotency_scope:
            return self.idempotency_scope
        program = self.get_idempotency_phases()
        if program is not None and program.scope:
            return program.scope
        cls = type(self)
        action = getattr(self, "action", None) or str(self.request.method).lower()
        return f"{cls.__module__}.{cls.__qualname__}.{action}"

    def get_idempotency_principal(self) -> str:
        """Who is asking: part of the fingerprint, so another user's reuse is a mismatch."""
        return principal_of(getattr(self.request, "user", None))

    def get_idempotency_fingerprint(self) -> str:
        """SHA-256 of method, path, principal and the parsed body (``request.data``).

        ``request.data`` is parsed once and cached by DRF, so the handler reads
        the same data without touching the raw stream again.
        """
        request = self.request
        path = canonical_path(request.path, request.META.get("QUERY_STRING", ""))
        return fingerprint(
            str(request.method), path, self.get_idempotency_principal(), request.data
        )

    def perform_replay(self, stored: core.StoredResponse) -> HttpResponse:
        """Build the replayed answer; override to add headers or count replays."""
        return replay_response(stored)


class _DRFView(flow.KeyedView):
    """A DRF view as :func:`idempotency.flow.respond` sees it: the mixin's hooks."""

    def __init__(self, view: IdempotentViewMixin, handler: Any, request: Request,
                 args: Any, kwargs: dict[str, Any]) -> None:
        super().__init__(request)
        self.drf_request = request
        self.view, self.handler, self.args, self.kwargs = view, handler, args, kwargs
        self.program = view.get_idempotency_phases()
        # A program's phases cannot run without a key to resume by.
        self.required = True if self.program is not None else view.idempotency_key_required
        ttl = view.idempotency_ttl
        self.ttl = None if ttl is None else as_timedelta(ttl, "idempotency_ttl")
        self.wait = view.idempotency_wait

    def tenant(self) -> int | None:
        return self.view.tenant_id  # resolved by TenantScopedViewMixin.initial()

    def scope(self) -> str:
        return self.view.get_idempotency_scope()

    def fingerprint(self) -> str:
        return self.view.get_idempotency_fingerprint()

    def parse_key(self, value: str) -> str:
        return self.view.get_idempotency_key(value)

    def body(self) -> Any:
        return self.drf_request.data  # parsed once by DRF, cached for the handler

    def run(self) -> HttpResponse:
        return self.handler(self.drf_request, *self.args, **self.kwargs)  # type: ignore[no-any-return]

    def run_keyed(self) -> HttpResponse:
        return self.view._keyed_answer(self.handler, self.drf_request, self.args, self.kwargs)

    def replay(self, stored: core.StoredResponse) -> HttpResponse:
        return self.view.perform_replay(stored)

    def run_program(self, keyed: core.IdempotentRequest) -> core.Result[core.StoredResponse] | None:
        if self.program is None:
            return None
        return self.view._run_phases(self.program, self.kwargs, keyed)
