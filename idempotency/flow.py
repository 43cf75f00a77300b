"""One HTTP request through the ``Idempotency-Key`` contract, for any Django view.

The DRF mixin (:mod:`idempotency.mixins`) and the decorator for plain Django
views (:mod:`idempotency.decorators`) differ in how a view is called, rendered
and fingerprinted; the rest is :func:`respond`, which both call:

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
from idempotency.conf import idempotency_settings
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


def respond(
    request: HttpRequest,
    view: Callable[[], HttpResponse],
    *,
    scope: Callable[[], str],
    fingerprint: Callable[[], str],
    required: bool | None = None,
    ttl: timedelta | None = None,
    wait: float | None = None,
    parse_key: Callable[[str], str] = core.parse_key,
    get_tenant: Callable[[], int | None] | None = None,
    replay: Callable[[core.StoredResponse], HttpResponse] = replay_response,
    keyed_view: Callable[[], HttpResponse] | None = None,
    run_program: Callable[[core.IdempotentRequest], core.Result[core.StoredResponse]]
    | None = None,
    body: Callable[[], Any] | None = None,
) -> HttpResponse:
    """Answer ``request`` under the contract.

    Args:
        request: the Django request (a DRF ``Request`` works too).
        view: runs the view as it would run without this library.
        scope, fingerprint: the key's scope and the request's fingerprint;
            called once the key and tenant are known.
        required: answer 400 to a request without a key
            (``IDEMPOTENCY["REQUIRED"]`` when None).
        ttl: how long the answer is replayed (``IDEMPOTENCY["TTL"]`` when None).
        wait: seconds to wait for a duplicate in flight (``IN_PROGRESS_WAIT``).
        parse_key: turns the header value into a key, or raises ``InvalidKey``.
        get_tenant: the request's tenant; ``TENANCY["TENANT_RESOLVER"]`` when None.
        replay: builds the replayed answer from the stored one.
        keyed_view: runs the view and returns its final, rendered answer
            (``view`` when None): under a key, where the answer is stored as
            returned, and for safe methods, rendered as the tenant.
        run_program: phases mode: runs the program for the key, instead of
            running ``keyed_view`` in one transaction with it. It may raise
            ``RequestRefused`` before it claims the key.
        body: parses the request's body (DRF's ``request.data``); the parsed
            body is checked before the key is looked up
            (:func:`idempotency.inputs.check_body`).
    """
    if request.method in SAFE_METHODS:
        tenant_id = get_tenant() if get_tenant else resolve_tenant(request)
        if tenant_id is None:
            return no_tenant_response()
        with tenant_context(tenant_id, using=app_alias()):
            return (keyed_view or view)()
    checked = check_request(
        request,
        required=idempotency_settings.REQUIRED if required is None else required,
        parse_key=parse_key,
        get_tenant=get_tenant,
    )
    if isinstance(checked, HttpResponse):
        _count_refused(scope)
        return checked
    key, tenant_id = checked
    if key is None:  # optional and absent: run as the tenant, without a key
        with tenant_context(tenant_id, using=app_alias()):
            return view()
    with tracing.span("idempotency.request", {"idempotency.scope": _scope_of(scope)}):
        try:
            inputs.check_size(request)
            inputs.check_path(request.path)
            if body is not None:
                inputs.check_body(inputs.parsed(body))
            keyed = core.IdempotentRequest(
                tenant_id=tenant_id,
                scope=scope(),
                key=key,
                fingerprint=inputs.parsed(fingerprint),
                method=str(request.method),
                path=request.path,
                ttl=ttl,
            )
            if run_program is not None:
                result = run_program(keyed)
                _count(keyed.scope, result.outcome.value)
                if result.outcome is core.Outcome.EXECUTED:
                    assert result.value is not None
                    return http_response(result.value)
                return answer(result, replay=replay)
        except RequestRefused as refused:
            _count_refused(scope)
            return problem_response(refused.status, refused.code, refused.detail)
        with metrics.timed_request(keyed.scope) as handler_seconds:
            executed = core.execute(
                keyed, _timed(keyed_view or view, handler_seconds), to_stored_response,
                wait=wait, using=app_alias(),
            )
        _count(keyed.scope, executed.outcome.value)
        return answer(executed, replay=replay)


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


def check_request(
    request: HttpRequest,
    *,
    required: bool,
    parse_key: Callable[[str], str] = core.parse_key,
    get_tenant: Callable[[], int | None] | None = None,
) -> tuple[str | None, int] | HttpResponse:
    """Find the tenant, then validate the key header.

    Returns:
        ``(key, tenant_id)`` to go on, where ``key`` is None when the request
        has no key and none is required (run the view, without a key, as the
        tenant); or the error answer to send instead.
    """
    tenant_id = get_tenant() if get_tenant else resolve_tenant(request)
    if tenant_id is None:
        return no_tenant_response()
    s = idempotency_settings
    header = request.headers.get(s.HEADER)
    key: str | None = None
    if header is None:
        if required:
            return problem_response(
                s.STATUS_KEY_MISSING,
                "idempotency_key_missing",
                f"This operation requires an {s.HEADER} header.",
            )
    else:
        try:
            key = parse_key(header)
        except core.InvalidKey as exc:
            return problem_response(s.STATUS_KEY_INVALID, "idempotency_key_invalid", str(exc))
    return key, tenant_id
