"""Prometheus metrics, through ``prometheus_client`` (the optional ``[metrics]`` extra).

The library counts at a few points (the request flow, ``publish()``, the
relay, the consumers, the receivers, the reaper and the completer) by calling
the functions of this module. Each of them first asks :func:`instruments`,
which is None when ``OBSERVABILITY["METRICS"]`` is off or ``prometheus_client``
is not installed: then nothing is imported and a call costs one settings
lookup.

Gauges that need SQL (reader lag, the transaction holding delivery back,
parked messages) are not kept up to date by anyone: :class:`OutboxCollector`
reads them at scrape time, on the system alias (or
``OBSERVABILITY["METRICS_DATABASE"]``), through :mod:`outbox.observation`'s store
queries. Serve them with :func:`metrics_view` (a Django view) or, in the
long-running commands, ``--metrics-port`` (:func:`serve`).

Several processes (gunicorn workers): set ``PROMETHEUS_MULTIPROC_DIR`` to an
empty directory before the workers start, and call :func:`child_exit` from
gunicorn's ``child_exit`` hook; :func:`metrics_view` then adds up every
process's counters (prometheus_client's multiprocess mode). docs/operations.md
has the whole setup and the alerts as PromQL.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django_idempotency_outbox.observability import observability_settings

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

logger = logging.getLogger("django_idempotency_outbox")

#: Outcomes of a keyed request, the values of the ``outcome`` label.
OUTCOMES = ("executed", "replayed", "mismatch", "in_progress", "refused")

#: Latency buckets, in seconds (from a replay's ~1 ms to a slow handler).
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Instruments:
    """The library's counters and histograms, registered once per process."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        self.requests = Counter(
            "dio_idempotency_requests", "Requests with an Idempotency-Key, by scope and outcome.",
            ["scope", "outcome"],
        )
        self.handler_seconds = Histogram(
            "dio_idempotency_handler_seconds", "Time in the view's handler, under a key.",
            ["scope"], buckets=_BUCKETS,
        )
        self.store_seconds = Histogram(
            "dio_idempotency_store_seconds",
            "Time in the library around the handler: key lookup, stored answer, commit.",
            ["scope"], buckets=_BUCKETS,
        )
        self.published = Counter(
            "dio_outbox_published", "Messages committed by publish(), by topic.", ["topic"]
        )
        self.relayed = Counter(
            "dio_outbox_relayed", "Messages the relay sent to the broker.", ["relay"]
        )
        self.consumed = Counter(
            "dio_outbox_consumed", "Messages whose handling committed, by consumer or receiver.",
            ["consumer"],
        )
        self.parked = Counter(
            "dio_outbox_parked", "Messages parked in the dead-letter table.", ["consumer"]
        )
        self.runs = Counter(
            "dio_upkeep_runs", "Runs of the upkeep jobs.", ["job"]
        )
        self.upkeep_rows = Counter(
            "dio_upkeep_rows", "Rows the upkeep jobs deleted or finished.", ["job"]
        )


_instruments: Instruments | None = None
_unavailable = False
#: Registering twice raises: threads of one worker may ask first at the same time.
_registering = threading.Lock()


def instruments() -> Instruments | None:
    """The counters, or None when metrics are off or prometheus_client is missing."""
    global _instruments, _unavailable
    if _instruments is not None:
        return _instruments if observability_settings.METRICS else None
    if _unavailable or not observability_settings.METRICS:
        return None
    with _registering:
        if _instruments is None and not _unavailable:
            try:
                _instruments = Instruments()
            except ImportError:
                _unavailable = True
                return None
    return _instruments


# -- the points the library calls ----------------------------------------------


def request(scope: str, outcome: str) -> None:
    m = instruments()
    if m is not None:
        m.requests.labels(scope, outcome).inc()


@contextmanager
def timed_request(scope: str) -> Iterator[list[float]]:
    """Times a keyed request; the caller adds the handler's seconds to the list it gets."""
    m = instruments()
    handler: list[float] = []
    if m is None:
        yield handler
        return
    started = time.perf_counter()
    try:
        yield handler
    finally:
        total = time.perf_counter() - started
        spent = sum(handler)
        if handler:
            m.handler_seconds.labels(scope).observe(spent)
        m.store_seconds.labels(scope).observe(max(total - spent, 0.0))


def published(topic: str) -> None:
    m = instruments()
    if m is not None:
        m.published.labels(topic).inc()


def relayed(relay: str, count: int) -> None:
    m = instruments()
    if m is not None and count:
        m.relayed.labels(relay).inc(count)


def consumed(consumer: str, count: int = 1) -> None:
    m = instruments()
    if m is not None and count:
        m.consumed.labels(consumer).inc(count)


def parked(consumer: str) -> None:
    m = instruments()
    if m is not None:
        m.parked.labels(consumer).inc()


def upkeep(job: str, rows: int = 0) -> None:
    """One run of an upkeep job (``reap_keys``, ``complete_keys``, ``reap_outbox``)."""
    m = instruments()
    if m is not None:
        m.runs.labels(job).inc()
        if rows:
            m.upkeep_rows.labels(job).inc(rows)


# -- the scrape-time gauges -----------------------------------------------------


class OutboxCollector:
    """Reads the outbox's gauges from the database when Prometheus scrapes.

    One scrape is a handful of indexed queries on one connection of the
    system alias (closed afterwards: a scrape may run in a thread of its
    own). If the database cannot be read, the scrape still answers, with
    ``dio_outbox_scrape_ok 0`` and without the gauges.
    """

    def collect(self) -> Iterator[Any]:
        from django.db import connections
        from prometheus_client.core import GaugeMetricFamily

        from outbox.observation import observe
        from tenancy.aliases import system_alias

        ok = GaugeMetricFamily("dio_outbox_scrape_ok", "1 when the outbox gauges were read.")
        try:
            alias = system_alias(observability_settings.METRICS_DATABASE)
            try:
                seen = observe(alias)
            finally:
                connections[alias].close()
        except Exception as exc:  # a database error or a misconfigured alias: still answer
            logger.warning("metrics: could not read the outbox gauges: %s",
                           str(exc).strip().splitlines()[0] if str(exc).strip() else exc)
            ok.add_metric([], 0)
            yield ok
            return
        ok.add_metric([], 1)
        yield ok
        behind = GaugeMetricFamily(
            "dio_outbox_lag_messages",
            "Committed messages a reader has not passed yet (held back or not).",
            labels=["reader", "partition"])
        lag = GaugeMetricFamily(
            "dio_outbox_lag_seconds",
            "Age of the first committed message a reader has not passed (0: none).",
            labels=["reader", "partition"])
        lease = GaugeMetricFamily(
            "dio_outbox_relay_lease_seconds",
            "Seconds left on a relay's lease; negative once it has run out (a relay died).",
            labels=["relay"])
        for r in seen.readers:
            labels = [r.name, str(r.partition)]
            behind.add_metric(labels, r.behind)
            lag.add_metric(labels, r.lag.total_seconds() if r.lag else 0.0)
            if r.is_relay and r.lease_left is not None:
                lease.add_metric([r.name.removeprefix("relay:")], r.lease_left)
        yield behind
        yield lag
        yield lease
        held = GaugeMetricFamily(
            "dio_outbox_held_back_messages",
            "Committed messages waiting for an open transaction that published for their "
            "tenant to end.")
        held.add_metric([], seen.held_back)
        yield held
        age = GaugeMetricFamily(
            "dio_outbox_blocker_age_seconds",
            "Age of the oldest open transaction that published (0: none); it holds back "
            "its own tenants' later messages.")
        ages = [p.age.total_seconds() for p in seen.publishers if p.age is not None]
        age.add_metric([], max(ages, default=0.0))
        yield age
        parked_now = GaugeMetricFamily(
            "dio_outbox_parked_messages", "Messages in the dead-letter table, by consumer.",
            labels=["consumer"])
        for name, count in sorted(seen.parked.items()):
            parked_now.add_metric([name], count)
        yield parked_now


class _Union:
    """A collector yielding what several collectors (or registries) yield."""

    def __init__(self, *parts: Any) -> None:
        self.parts = parts

    def collect(self) -> Iterator[Any]:
        for part in self.parts:
            yield from part.collect()


def registry(*, gauges: bool = True) -> Any:
    """What one scrape exposes: this process's metrics (or, in multiprocess
    mode, every process's), plus the outbox gauges when ``gauges``."""
    from prometheus_client import REGISTRY, CollectorRegistry

    scrape = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        # prometheus_client's multiprocess module is unannotated
        multiprocess.MultiProcessCollector(scrape)  # type: ignore[no-untyped-call]
        if gauges:
            scrape.register(OutboxCollector())
        return scrape
    parts: list[Any] = [REGISTRY]
    if gauges:
        parts.append(OutboxCollector())
    scrape.register(_Union(*parts))
    return scrape


def exposition(*, gauges: bool = True) -> tuple[bytes, str]:
    """The scrape's body and content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    instruments()  # registered before the first scrape, so every series shows from the start
    return generate_latest(registry(gauges=gauges)), CONTENT_TYPE_LATEST


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: Prometheus's text format (404 when metrics are off or missing).

    Route it where only Prometheus reaches it (it names tenants' scopes and
    topics): ``path("metrics", metrics_view)``.
    """
    from django.http import Http404, HttpResponse

    if instruments() is None:
        raise Http404("metrics are off, or prometheus_client is not installed")
    body, content_type = exposition()
    return HttpResponse(body, content_type=content_type)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve this process's metrics and the outbox gauges on ``addr:port`` (a daemon thread).

    Used by the long-running commands' ``--metrics-port``.

    Raises:
        RuntimeError: metrics are off or prometheus_client is not installed.
        OSError: the port cannot be bound.
    """
    if instruments() is None:
        raise RuntimeError(
            'metrics are unavailable: install the [metrics] extra (prometheus_client) and '
            'leave OBSERVABILITY["METRICS"] on'
        )
    from prometheus_client import start_http_server

    start_http_server(port, addr, registry=registry())


def child_exit(server: Any, worker: Any) -> None:
    """gunicorn's ``child_exit`` hook in multiprocess mode: forget a dead worker's live gauges.

    In gunicorn.conf.py: ``from django_idempotency_outbox.metrics import child_exit``.
    """
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    try:
        from prometheus_client import multiprocess
    except ImportError:
        return
    # prometheus_client's multiprocess module is unannotated
    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]
