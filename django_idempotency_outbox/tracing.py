"""OpenTelemetry spans and trace-context propagation (the optional ``[tracing]`` extra).

One trace follows an order from the request that published its events to
everything they caused:

- ``idempotency.request`` around a keyed request, with ``idempotency.key_lookup``,
  ``idempotency.handler`` and ``idempotency.store`` inside it;
- :func:`outbox.publish` writes the current trace context into the message's
  headers (``traceparent``, and ``tracestate`` when there is one);
- the relay starts ``outbox.relay`` as a child of that context for each
  message it sends, and the Celery transport puts ``traceparent`` into the
  Celery task's own headers too;
- a consumer's ``handle`` runs in ``outbox.consume``, and a Celery receiver's
  body in ``outbox.receive``, each a child of the message's context.

Only the OpenTelemetry *API* is used: spans go wherever the application's
SDK (its TracerProvider and exporters) sends them. When the API is not
installed, or ``OBSERVABILITY["TRACING"]`` is off, every function here is a
no-op that imports nothing; with the API but no SDK set up, a no-op too (and
no ``traceparent`` is added to messages).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

from django_idempotency_outbox.observability import observability_settings

#: The headers that carry the trace context (W3C Trace Context).
CONTEXT_HEADERS = ("traceparent", "tracestate")

_api: Any = None
_unavailable = False


_no_sdk: tuple[type, ...] = ()


def _otel() -> Any:
    """The ``opentelemetry`` API modules, or None.

    None when tracing is off, the API is not installed, or no SDK is set up
    (the global tracer provider is still the API's placeholder): spans would
    then be no-ops, and making them costs more than the rest of a replay.
    """
    global _api, _unavailable, _no_sdk
    if not observability_settings.TRACING or _unavailable:
        return None
    if _api is None:
        try:
            from opentelemetry import context, propagate, trace
        except ImportError:
            _unavailable = True
            return None
        _no_sdk = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        _api = (trace, propagate, context, trace.get_tracer("django_idempotency_outbox"))
    if isinstance(_api[0].get_tracer_provider(), _no_sdk):
        return None
    return _api


def enabled() -> bool:
    return _otel() is not None


def span(name: str, attributes: Mapping[str, Any] | None = None) -> Any:
    """A context manager: a span named ``name`` under the current one (or nothing)."""
    api = _otel()
    if api is None:
        return nullcontext()
    return api[3].start_as_current_span(name, attributes=dict(attributes or {}))


def set_attribute(name: str, value: Any) -> None:
    """Set an attribute on the current span (nothing when tracing is off)."""
    api = _otel()
    if api is not None:
        api[0].get_current_span().set_attribute(name, value)


def inject(headers: dict[str, Any]) -> dict[str, Any]:
    """Add the current trace context to ``headers`` (a message's), unless it has one.

    Returns ``headers``, changed in place.
    """
    api = _otel()
    if api is None or "traceparent" in headers:
        return headers
    carrier: dict[str, str] = {}
    api[1].inject(carrier)
    headers.update({k: v for k, v in carrier.items() if k in CONTEXT_HEADERS})
    return headers


def context_headers(headers: Mapping[str, Any] | None) -> dict[str, str]:
    """The trace-context headers among a message's headers."""
    if not headers:
        return {}
    return {k: str(headers[k]) for k in CONTEXT_HEADERS if headers.get(k)}


@contextmanager
def message_span(
    name: str, headers: Mapping[str, Any] | None, attributes: Mapping[str, Any] | None = None,
    *, kind: str = "CONSUMER",
) -> Iterator[None]:
    """A span named ``name``, child of the trace context in a message's ``headers``."""
    api = _otel()
    if api is None:
        yield
        return
    trace, propagate, context, tracer = api
    parent = propagate.extract(context_headers(headers))
    with tracer.start_as_current_span(
        name, context=parent, kind=getattr(trace.SpanKind, kind),
        attributes=dict(attributes or {}),
    ):
        yield


def message_attributes(message: Any) -> dict[str, Any]:
    """The attributes a message's spans carry (OpenTelemetry's messaging conventions)."""
    return {
        "messaging.system": "outbox",
        "messaging.destination.name": message.topic,
        "messaging.message.id": str(message.message_id),
        "outbox.tenant_id": message.tenant_id,
    }


def start_message_span(
    name: str, headers: Mapping[str, Any] | None, attributes: Mapping[str, Any] | None = None,
    *, kind: str = "PRODUCER",
) -> Any:
    """Start (not make current) a span, child of a message's trace context; the caller ends it.

    Only call it when :func:`enabled`.
    """
    trace, propagate, context, tracer = _otel()
    return tracer.start_span(
        name, context=propagate.extract(context_headers(headers)),
        kind=getattr(trace.SpanKind, kind), attributes=dict(attributes or {}),
    )


def fail(span: Any, exc: BaseException) -> None:
    """Mark ``span`` as failed with ``exc``."""
    trace = _otel()[0]
    span.record_exception(exc)
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
