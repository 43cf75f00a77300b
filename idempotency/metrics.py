"""What the idempotency app counts: keyed requests, by scope and outcome, and their time.

Declared here, served by :mod:`django_idempotency_outbox.metrics` (the
``[metrics]`` extra). Each function costs one settings lookup when metrics
are off or ``prometheus_client`` is not installed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from django_idempotency_outbox.metrics import BUCKETS, Instruments, upkeep

__all__ = ["OUTCOMES", "instruments", "register", "request", "timed_request", "upkeep"]

#: Outcomes of a keyed request, the values of the ``outcome`` label.
OUTCOMES = ("executed", "replayed", "mismatch", "in_progress", "refused")


class IdempotencyInstruments(Instruments):
    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        self.requests = Counter(
            "dio_idempotency_requests", "Requests with an Idempotency-Key, by scope and outcome.",
            ["scope", "outcome"],
        )
        self.handler_seconds = Histogram(
            "dio_idempotency_handler_seconds", "Time in the view's handler, under a key.",
            ["scope"], buckets=BUCKETS,
        )
        self.store_seconds = Histogram(
            "dio_idempotency_store_seconds",
            "Time in the library around the handler: key lookup, stored answer, commit.",
            ["scope"], buckets=BUCKETS,
        )


def instruments() -> IdempotencyInstruments | None:
    """The app's counters, or None when metrics are off or prometheus_client is missing."""
    return IdempotencyInstruments.get()


def register() -> None:
    """Make the counters now (``IdempotencyConfig.ready()``), not on a process's first count."""
    instruments()


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
