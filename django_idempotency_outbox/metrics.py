"""Prometheus metrics, through ``prometheus_client`` (the optional ``[metrics]`` extra).

The machinery only: each app declares what it counts and what it reads at
scrape time (:mod:`idempotency.metrics`, :mod:`outbox.metrics`), and this
module serves whatever they registered.

- :class:`Instruments`: an app's counters and histograms, one subclass per
  app, made once per process. ``SubClass.get()`` is None when
  ``OBSERVABILITY["METRICS"]`` is off or ``prometheus_client`` is not
  installed: then nothing is imported, and a count costs one settings lookup.
- :func:`add_collector`: gauges an app reads from the database when
  Prometheus scrapes (the outbox's lag, the transactions that hold delivery
  back, parked messages), rather than keeping them up to date.
- :func:`upkeep`: the counters every upkeep job shares (runs, rows), by job.

Serve them with :func:`metrics_view` (a Django view) or, in the long-running
commands, ``--metrics-port`` (:func:`serve`). Several processes (gunicorn
workers): set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory before the
workers start, and call :func:`child_exit` from gunicorn's ``child_exit``
hook; :func:`metrics_view` then adds up every process's counters
(prometheus_client's multiprocess mode). docs/operations.md has the whole
setup and the alerts as PromQL.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Self

from django_idempotency_outbox.observability import observability_settings

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

#: Latency buckets, in seconds (from a replay's ~1 ms to a slow handler).
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: Making instruments twice raises (prometheus_client refuses a name twice):
#: threads of one worker may ask first at the same time.
_registering = threading.Lock()

#: Every kind of instruments declared so far (one per app, and the upkeep's).
_kinds: list[type[Instruments]] = []

#: Factories of the collectors read at scrape time (:func:`add_collector`).
_collectors: list[Callable[[], Any]] = []


class Instruments:
    """Base class of one app's counters and histograms, made once per process.

    A subclass creates its ``prometheus_client`` metrics in ``__init__``
    (importing ``prometheus_client`` there, never at module level); the app
    asks :meth:`get` before each count.
    """

    _instance: ClassVar[Instruments | None] = None
    _unavailable: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._instance = None
        cls._unavailable = False
        _kinds.append(cls)

    @classmethod
    def get(cls) -> Self | None:
        """The instruments, or None when metrics are off or prometheus_client is missing."""
        instance = cls._instance
        if instance is not None:
            return instance if observability_settings.METRICS else None  # type: ignore[return-value]
        if cls._unavailable or not observability_settings.METRICS:
            return None
        with _registering:
            if cls._instance is None and not cls._unavailable:
                try:
                    cls._instance = cls()
                except ImportError:
                    cls._unavailable = True
                    return None
        return cls._instance  # type: ignore[return-value]


def register() -> bool:
    """Make every declared kind of instruments now; False when metrics are unavailable.

    Apps call it from ``AppConfig.ready()``, so that a Celery pool process or
    a gunicorn worker forked afterwards inherits them and no request or task
    pays for importing prometheus_client; a scrape calls it too, so that every
    series shows from the start.
    """
    made = [kind.get() for kind in list(_kinds)]
    return bool(made) and all(m is not None for m in made)


def add_collector(factory: Callable[[], Any]) -> None:
    """Read ``factory()``'s gauges at every scrape (once per factory, whoever asks twice)."""
    if factory not in _collectors:
        _collectors.append(factory)


# -- the upkeep jobs' counters, shared by every app's jobs --------------------------


class UpkeepInstruments(Instruments):
    def __init__(self) -> None:
        from prometheus_client import Counter

        self.runs = Counter("dio_upkeep_runs", "Runs of the upkeep jobs.", ["job"])
        self.rows = Counter(
            "dio_upkeep_rows", "Rows the upkeep jobs deleted or finished.", ["job"]
        )


def upkeep(job: str, rows: int = 0) -> None:
    """One run of an upkeep job (``reap_keys``, ``complete_keys``, ``reap_outbox``)."""
    m = UpkeepInstruments.get()
    if m is not None:
        m.runs.labels(job).inc()
        if rows:
            m.rows.labels(job).inc(rows)


def available() -> bool:
    """Whether metrics are on and prometheus_client is installed."""
    return UpkeepInstruments.get() is not None


# -- serving -------------------------------------------------------------------------


class _Union:
    """A collector yielding what several collectors (or registries) yield."""

    def __init__(self, *parts: Any) -> None:
        self.parts = parts

    def collect(self) -> Iterator[Any]:
        for part in self.parts:
            yield from part.collect()


def registry(*, gauges: bool = True) -> Any:
    """What one scrape exposes: this process's metrics (or, in multiprocess
    mode, every process's), plus the apps' scrape-time gauges when ``gauges``."""
    from prometheus_client import REGISTRY, CollectorRegistry

    scrape = CollectorRegistry(auto_describe=False)
    collectors = [factory() for factory in _collectors] if gauges else []
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        # prometheus_client's multiprocess module is unannotated
        multiprocess.MultiProcessCollector(scrape)  # type: ignore[no-untyped-call]
        for collector in collectors:
            scrape.register(collector)
        return scrape
    scrape.register(_Union(REGISTRY, *collectors))
    return scrape


def exposition(*, gauges: bool = True) -> tuple[bytes, str]:
    """The scrape's body and content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    register()  # every series shows from the start
    return generate_latest(registry(gauges=gauges)), CONTENT_TYPE_LATEST


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: Prometheus's text format (404 when metrics are off or missing).

    Route it where only Prometheus reaches it (it names tenants' scopes and
    topics): ``path("metrics", metrics_view)``.
    """
    from django.http import Http404, HttpResponse

    if not available():
        raise Http404("metrics are off, or prometheus_client is not installed")
    body, content_type = exposition()
    return HttpResponse(body, content_type=content_type)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve this process's metrics and the scrape-time gauges on ``addr:port`` (a daemon thread).

    Used by the long-running commands' ``--metrics-port``.

    Raises:
        RuntimeError: metrics are off or prometheus_client is not installed.
        OSError: the port cannot be bound.
    """
    if not available():
        raise RuntimeError(
            'metrics are unavailable: install the [metrics] extra (prometheus_client) and '
            'leave OBSERVABILITY["METRICS"] on'
        )
    from prometheus_client import start_http_server

    register()
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
