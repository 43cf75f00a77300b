"""One trace from the POST that published an order to everything it caused.

The spans go to OpenTelemetry's in-memory exporter. The Celery receiver runs
in a real Celery worker (embedded in this process, so that its spans reach
the same exporter), fed by the relay through the real Redis broker.
"""

from __future__ import annotations

import uuid

import pytest
from celery.contrib.testing.worker import start_worker
from celery.signals import task_prerun
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox.relay import Relay
from outbox.testing import InMemoryTransport
from outbox.transports import CeleryTransport
from tests.helpers import count_rows
from tests.idempotency.conftest import Client
from tests.outbox.support.helpers import drain, wait_for
from tests.outbox.support.recorders import OrderRecorder

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def _provider():
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)  # once per process: OpenTelemetry refuses a second
    yield


@pytest.fixture(autouse=True)
def _spans():
    EXPORTER.clear()
    yield
    EXPORTER.clear()


def spans(name: str) -> list:
    return [s for s in EXPORTER.get_finished_spans() if s.name == name]


def one(name: str):
    found = spans(name)
    assert len(found) == 1, f"{len(found)} {name} span(s)"
    return found[0]


def post_order(key: str = "traced") -> None:
    response = Client().order(key=key, path="/published-orders/")
    assert response.status_code == 201


def test_the_request_has_spans_for_the_key_lookup_the_handler_and_the_store():
    post_order()
    root = one("idempotency.request")
    assert root.parent is None
    assert root.attributes["idempotency.scope"] == "order.create-published"
    assert root.attributes["idempotency.outcome"] == "executed"
    for child in ("idempotency.key_lookup", "idempotency.handler", "idempotency.store"):
        assert one(child).parent.span_id == root.context.span_id, child
    EXPORTER.clear()
    post_order()  # a replay: a lookup, no handler
    assert one("idempotency.request").attributes["idempotency.outcome"] == "replayed"
    assert spans("idempotency.handler") == []


def test_one_trace_from_the_post_to_the_relay_and_the_consumer():
    post_order()
    handler = one("idempotency.handler")
    drain(OrderRecorder())
    relay = Relay(InMemoryTransport())
    try:
        relay.drain()
    finally:
        relay.release()
    [sent] = relay.transport.sent
    assert sent.headers["traceparent"].split("-")[1] == format(handler.context.trace_id, "032x")
    consume, relayed = one("outbox.consume"), one("outbox.relay")
    for span in (consume, relayed):
        assert span.context.trace_id == handler.context.trace_id
        assert span.parent.span_id == handler.context.span_id  # published in the handler
    assert consume.kind is trace.SpanKind.CONSUMER
    assert relayed.kind is trace.SpanKind.PRODUCER
    assert consume.attributes["outbox.consumer"] == "orders"
    assert consume.attributes["messaging.destination.name"] == "order.placed"


def test_a_failing_handler_is_recorded_on_its_span():
    from tests.outbox.support.helpers import publish_as

    publish_as(1, "order.placed", {"sku": "bad", "poison": True})
    drain(OrderRecorder())
    failed = [s for s in spans("outbox.consume") if not s.status.is_ok]
    assert failed and failed[0].events[0].name == "exception"


def tracing_celery_app(queue: str):
    """A Celery app of this test's own: its task is not shared, so no other test's
    app (tests/outbox/test_checks.py finalizes several) ever sees it."""
    from celery import Celery
    from django.conf import settings

    from outbox.receivers import receiver
    from tenancy import current_tenant_id
    from tests.testapp.models import Order

    app = Celery("dio_tracing_tests", broker=settings.CELERY_BROKER_URL, set_as_current=False)
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True,
                    task_ignore_result=True)

    @app.task(name="tests.tracing.receive", shared=False)
    @receiver("tests.tracing.receive")
    def receive(message):
        Order.objects.create(tenant_id=current_tenant_id(), sku="traced",
                             note=str(message.message_id))

    return app


def test_the_trace_reaches_a_celery_receiver_through_the_task_headers(settings):
    """Two requests, two traces, relayed in one batch: each task carries its own.

    docs/outbox.md: the message template of the Redis path is not used while
    tracing is on, since each message carries its own trace context; one made
    from one message would give every task of the batch that message's trace.
    """
    from celery import _state

    queue = f"dio-tracing-{uuid.uuid4().hex[:8]}"
    app = tracing_celery_app(queue)
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_SEND_TASK": False, "CELERY_APP": app,
                       "CELERY_TASK": "tests.tracing.receive", "CELERY_QUEUE": queue}
    seen_headers: list[str | None] = []

    def remember(task=None, **kwargs):
        seen_headers.append(task.request.get("traceparent"))

    saved = (_state.default_app, getattr(_state._tls, "current_app", None))
    task_prerun.connect(remember, weak=False)
    try:
        with start_worker(app, perform_ping_check=False, shutdown_timeout=30):
            post_order("traced-1")
            post_order("traced-2")
            relay = Relay(CeleryTransport(app))
            try:
                assert relay.drain() == 2  # one batch
            finally:
                relay.release()
            wait_for(lambda: len(spans("outbox.receive")) == 2, "the receivers' spans")
    finally:
        task_prerun.disconnect(remember)
        _state.default_app, _state._tls.current_app = saved  # start_worker made it current
    handlers = {s.context.trace_id: s for s in spans("idempotency.handler")}
    assert len(handlers) == 2  # two requests, two traces
    for receive in spans("outbox.receive"):
        handler = handlers[receive.context.trace_id]
        assert receive.parent.span_id == handler.context.span_id
        assert receive.attributes["outbox.receiver"] == "tests.tracing.receive"
    assert {s.context.trace_id for s in spans("outbox.receive")} == set(handlers)
    # The Celery tasks' own headers carry the context too (for Celery's own tracing).
    assert len(seen_headers) == 2 and None not in seen_headers
    assert {h.split("-")[1] for h in seen_headers} == {format(t, "032x") for t in handlers}
    assert count_rows("testapp_order") == 4  # the orders, and the receiver's record of each


def test_tracing_off_adds_no_header_and_no_span(settings):
    settings.OBSERVABILITY = {"TRACING": False}
    post_order()
    relay = Relay(InMemoryTransport())
    try:
        relay.drain()
    finally:
        relay.release()
    assert "traceparent" not in relay.transport.sent[0].headers
    assert EXPORTER.get_finished_spans() == ()


def test_without_an_sdk_tracing_is_off_and_adds_no_header():
    """The API alone (no TracerProvider set) makes no span and no traceparent."""
    import subprocess
    import sys

    from tests.live import ROOT

    script = (
        "import django; django.setup()\n"
        "from django_idempotency_outbox import tracing\n"
        "print(tracing.enabled(), tracing.inject({}))\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "trace.set_tracer_provider(TracerProvider())\n"
        "with trace.get_tracer('t').start_as_current_span('s'):\n"
        "    print(tracing.enabled(), sorted(tracing.inject({})))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60,
                          env={**__import__("os").environ,
                               "DJANGO_SETTINGS_MODULE": "tests.settings"})
    assert done.stdout.splitlines() == ["False {}", "True ['traceparent']"], done.stderr
