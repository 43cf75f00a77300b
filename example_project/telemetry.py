"""Tracing for the demo: every process writes its spans to one JSON-lines file.

A real deployment sends spans to a collector (OTLP) and looks at them in
Jaeger, Tempo or the like; the demo has neither, so each of its processes
(web workers, relay, consumers, Celery worker) appends its finished spans to
``$DEMO_TRACE_FILE``, and ``/traces/`` (example_project/traces.py) draws the
latest traces from it. Nothing here is part of the library: it only emits
spans through the OpenTelemetry API, to whatever provider the project sets.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any


def process_name() -> str:
    argv = " ".join(sys.argv)
    for name in ("relay_outbox", "run_consumers", "gunicorn", "celery"):
        if name in argv:
            return {"gunicorn": "web", "celery": "celery worker"}.get(name, name)
    return "shop"


def configure() -> None:
    """Install a TracerProvider writing to ``$DEMO_TRACE_FILE`` (nothing when unset)."""
    path = os.environ.get("DEMO_TRACE_FILE")
    if not path:
        return
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            SimpleSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
    except ImportError:
        return

    class JsonLinesExporter(SpanExporter):
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            lines = "".join(json.dumps(_as_dict(s)) + "\n" for s in spans)
            with self.lock, open(path, "a") as out:
                out.write(lines)
            return SpanExportResult.SUCCESS

    provider = TracerProvider(resource=Resource.create({"service.name": process_name()}))
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter()))
    trace.set_tracer_provider(provider)


def _as_dict(span: Any) -> dict[str, Any]:
    parent = span.parent
    return {
        "trace_id": format(span.context.trace_id, "032x"),
        "span_id": format(span.context.span_id, "016x"),
        "parent_id": format(parent.span_id, "016x") if parent else None,
        "name": span.name,
        "service": span.resource.attributes.get("service.name", ""),
        "start": span.start_time,
        "end": span.end_time,
        "ok": span.status.is_ok,
        "attributes": {k: v for k, v in span.attributes.items()},
    }
