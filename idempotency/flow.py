"""One HTTP request through the ``Idempotency-Key`` contract, for any Django view.

The DRF mixin (:mod:`idempotency.mixins`) and the decorator for plain Django
views (:mod:`idempotency.decorators`) differ in how a view is called, rendered
and fingerprinted: each says so in one small adapter, a :class:`KeyedView`.
The rest is :func:`respond`, which both call with their adapter:

1. the tenant is found (a problem answer if there is none);
2. safe methods run as the tenant, with no key;
3. the key header is checked; without a key where none is required, the view
   runs as the tenant;
4. the request's path, size and parsed body are checked
   (:mod:`idempotency.inputs`): bad input is a 400 or 413 problem, with
   nothing looked up or written;
5. otherwise the state machine (:func:`idempotency.core.execute`, or a
   phases program) runs the view at most once, and the result is answered:
   the view's own response, a replay, 422 or 409.

No DRF import here: a plain Django view gets exactly the same contract.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse

from django_idempotency_outbox import tracing
from idempotency import core, inputs, metrics
from idempotency.conf import HEADER, STATUS_KEY_INVALID, STATUS_KEY_MISSING, idempotency_settings
from idempotency.exceptions import RequestRefused
from idempotency.responses import (
    answer,
    http_response,
    problem_response,
    replay_response,
    to_stored_response,
)
from tenancy import tenant_context
from tenancy.aliases import app_alias
from tenancy.resolver import no_tenant_response, resolve_tenant

#: Methods that need no key; they still run as the request's tenant.
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class KeyedView:
    """What :func:`respond` asks of a view: the one adapter each kind of view passes.

    The DRF mixin (:mod:`idempotency.mixins`) and the decorator
    (:mod:`idempotency.decorators`) each subclass it; the defaults are what a
    plain Django view needs, so a subclass overrides only what differs.

    Attributes:
        request: the Django request (a DRF ``Request`` works too).
        required: answer 400 to a request without a key
            (``IDEMPOTENCY["REQUIRED"]`` when None).
        ttl: how long the answer is replayed (``IDEMPOTENCY["TTL"]`` when None).
        wait: seconds to wait for a duplicate in flight (``IN_PROGRESS_WAIT``
            when None).
    """

    required: bool | None = None
    ttl: timedelta | None = None
    wait: float | None = None

    def __init__(self, request: HttpRequest) -> None:
        self.request = request

    def tenant(self) -> int | None:
        """The request's tenant (``TENANCY["TENANT_RESOLVER"]``), or None."""
        return resolve_tenant(self.request)

    def scope(self) -> str:
        """The key's scope; called once the key and the tenant are known."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """The request's fingerprint; called once the key and the tenant are known."""
        raise NotImplementedError

    def parse_key(self, value: str) -> str:
        """The key in the header's value, or ``InvalidKey``."""
        return core.parse_key(value)

    def body(self) -> Any:
        """The parsed body, checked before the key is looked up (:func:`inputs.check_body`)."""
        return None

    def run(self) -> HttpResponse:
        """The view, as it would run without this library (an optional key left out)."""
        raise NotImplementedError

    def run_keyed(self) -> HttpResponse:
        """The view's final, rendered answer: stored as returned under a key (and what a
        safe method answers, rendered as the tenant)."""
        return self.run()

    def replay(self, stored: core.StoredResponse) -> HttpResponse:
        """The replayed answer built from the stored one."""
        return replay_response(stored)

    def run_program(self, keyed: core.IdempotentRequest) -> core.Result[core.StoredResponse] | None:
        """Phases mode: run the view's program for the key instead of :meth:`run_keyed` in one
        transaction with it; None when the view has none. May raise ``RequestRefused``
        before it claims the key."""
        return None


def respond(view: KeyedView) -> HttpResponse:
    """Answer ``view.request`` under the contract (the module's docstring says how)."""
    request = view.request
    if request.method in SAFE_METHODS:
        tenant_id = view.tenant()
        if tenant_id is None:
            return no_tenant_response()
        with tenant_context(tenant_id, using=app_alias()):
            return view.run_keyed()
    checked = check_request(view)
    if isinstance(checked, HttpResponse):
        _count_refused(view.scope)
        return checked
    key, tenant_id = checked
    if key is None:  # optional and absent: run as the tenant, without a key
        with tenant_context(tenant_id, using=app_alias()):
            return view.run()
    with tracing.span("idempotency.request", {"idempotency.scope": _scope_of(view.scope)}):
        try:
            inputs.check_size(request)
            inputs.check_path(request.path)
            inputs.check_body(inputs.parsed(view.body))
            keyed = core.IdempotentRequest(
                tenant_id=tenant_id,
                scope=view.scope(),
                key=key,
                fingerprint=inputs.parsed(view.fingerprint),
                method=str(request.method),
                path=request.path,
                ttl=view.ttl,
            )
            result = view.run_program(keyed)
            if result is not None:
                _count(keyed.scope, result.outcome.value)
                if result.outcome is core.Outcome.EXECUTED:
                    assert result.value is not None
                    return http_response(result.value)
                return answer(result, replay=view.replay)
        except RequestRefused as refused:
            _count_refused(view.scope)
            return problem_response(refused.status, refused.code, refused.detail)
        with metrics.timed_request(keyed.scope) as handler_seconds:
            executed = core.execute(
                keyed, _timed(view.run_keyed, handler_seconds), to_stored_response,
                wait=view.wait, using=app_alias(),
            )
        _count(keyed.scope, executed.outcome.value)
        return answer(executed, replay=view.replay)


def _scope_of(scope: Callable[[], str]) -> str:
    try:
        return scope()
    except Exception:  # a hook that needs what a refused request lacks
        return ""


def _count(scope: str, outcome: str) -> None:
    """Count a keyed request's outcome (one of :data:`metrics.OUTCOMES`)."""
    metrics.request(scope, outcome)
    tracing.set_attribute("idempotency.outcome", outcome)


def _count_refused(scope: Callable[[], str]) -> None:
    if metrics.instruments() is not None or tracing.enabled():
        _count(_scope_of(scope), "refused")


def _timed(
    handler: Callable[[], HttpResponse], seconds: list[float]
) -> Callable[[], HttpResponse]:
    """``handler`` in the ``idempotency.handler`` span, its time added to ``seconds``."""

    def run() -> HttpResponse:
        started = time.perf_counter()
        try:
            with tracing.span("idempotency.handler"):
                return handler()
        finally:
            seconds.append(time.perf_counter() - started)

    return run


def check_request(view: KeyedView) -> tuple[str | None, int] | HttpResponse:
    """Find the tenant, then validate the key header.

    Returns:
        ``(key, tenant_id)`` to go on, where ``key`` is None when the request
        has no key and none is required (run the view, without a key, as the
        tenant); or the error answer to send instead.
    """
    tenant_id = view.tenant()
    if tenant_id is None:
        return no_tenant_response()
    s = idempotency_settings
    required = s.REQUIRED if view.required is None else view.required
    header = _header(view.request, HEADER)
    key: str | None = None
    if header is None:
        if required:
            return problem_response(
                STATUS_KEY_MISSING,
                "idempotency_key_missing",
                f"This operation requires an {HEADER} header.",
            )
    else:
        try:
            key = view.parse_key(header)
        except core.InvalidKey as exc:
            return problem_response(STATUS_KEY_INVALID, "idempotency_key_invalid", str(exc))
    return key, tenant_id


def _header(request: HttpRequest, name: str) -> str | None:
    """The value of the request header ``name``, read from ``META``.

    ``request.headers`` would build a dict of every header for this one.
    """
    key = name.upper().replace("-", "_")
    if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):  # the two WSGI keeps unprefixed
        key = "HTTP_" + key
    value = request.META.get(key)
    return None if value is None else str(value)
