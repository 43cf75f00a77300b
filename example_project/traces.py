"""``/traces/``: the latest traces of the demo, drawn from its span file (staff only).

A stand-in for a trace viewer (Jaeger, Tempo...), enough to see one order's
trace: the request, its key lookup, handler and store, then the relay, the
consumer and the Celery receiver its events reached, each in its process.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.utils.html import escape

COLOURS = {"web": "#417690", "relay_outbox": "#b8860b", "run_consumers": "#2e8b57",
           "celery worker": "#8b3a62"}


def load() -> list[dict[str, Any]]:
    path = os.environ.get("DEMO_TRACE_FILE", "")
    if not path or not os.path.exists(path):
        return []
    with open(path) as spans:
        return [json.loads(line) for line in spans if line.strip()]


def latest_traces(spans: list[dict[str, Any]], count: int) -> list[list[dict[str, Any]]]:
    """The ``count`` latest traces that start with a keyed request and reached the
    outbox (3 spans or more), newest first."""
    by_trace: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        by_trace[span["trace_id"]].append(span)
    rooted = [s for s in by_trace.values()
              if any(x["name"] == "idempotency.request" and not x["parent_id"] for x in s)
              and len(s) >= 3]
    rooted.sort(key=lambda s: min(x["start"] for x in s), reverse=True)
    return rooted[:count]


def _ordered(spans: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    ids = {s["span_id"] for s in spans}
    for span in spans:
        children[span["parent_id"] if span["parent_id"] in ids else None].append(span)
    out: list[tuple[int, dict[str, Any]]] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in sorted(children[parent], key=lambda s: s["start"]):
            out.append((depth, span))
            walk(span["span_id"], depth + 1)

    walk(None, 0)
    return out


def _render(spans: list[dict[str, Any]]) -> str:
    start = min(s["start"] for s in spans)
    end = max(s["end"] for s in spans)
    total = max(end - start, 1)
    root = next(s for s in spans if s["name"] == "idempotency.request")
    attrs = root["attributes"]
    scope = escape(attrs.get("idempotency.scope", ""))
    outcome = escape(attrs.get("idempotency.outcome", ""))
    title = (f"trace {spans[0]['trace_id']} &mdash; {scope} ({outcome}), "
             f"{len(spans)} spans over {total / 1e6:.1f} ms")
    rows = []
    for depth, span in _ordered(spans):
        left = (span["start"] - start) / total * 100
        width = max((span["end"] - span["start"]) / total * 100, 0.3)
        colour = COLOURS.get(span["service"], "#666")
        attrs = span["attributes"]
        detail = " ".join(f"{k}={v}" for k, v in attrs.items()
                          if k in ("messaging.destination.name", "outbox.consumer",
                                   "outbox.receiver", "outbox.relay", "outbox.tenant_id"))
        rows.append(
            f'<tr><td style="padding-left:{depth * 18 + 4}px">{escape(span["name"])}'
            f'{"" if span["ok"] else " <b style=color:#c00>error</b>"}</td>'
            f'<td><span class="svc" style="background:{colour}">'
            f'{escape(span["service"])}</span></td>'
            f'<td class="bar"><div style="margin-left:{left:.2f}%;width:{width:.2f}%;'
            f'background:{colour}"></div></td>'
            f'<td class="ms">{(span["end"] - span["start"]) / 1e6:.1f} ms</td>'
            f'<td class="attrs">{escape(detail)}</td></tr>'
        )
    return f"<h2>{title}</h2><table>{''.join(rows)}</table>"


@staff_member_required
def traces(request: HttpRequest) -> HttpResponse:
    try:
        count = max(1, min(int(request.GET.get("n", "3")), 50))
    except ValueError:
        count = 3
    found = latest_traces(load(), count)
    body = "".join(_render(t) for t in found) or "<p>No trace yet: run the scenario.</p>"
    return HttpResponse(f"""<!doctype html><html><head><title>Traces</title><style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222 }}
h1 {{ font-size: 20px }} h2 {{ font-size: 15px; margin-top: 28px }}
table {{ border-collapse: collapse; width: 100% }}
td {{ padding: 3px 6px; border-bottom: 1px solid #eee; white-space: nowrap }}
td.bar {{ width: 45% }} td.bar div {{ height: 14px; border-radius: 2px }}
td.ms {{ text-align: right; color: #555 }} td.attrs {{ color: #555; font-size: 12px }}
.svc {{ color: #fff; border-radius: 3px; padding: 1px 6px; font-size: 12px }}
</style></head><body><h1>Latest traces (OpenTelemetry spans from every process)</h1>
{body}</body></html>""")
