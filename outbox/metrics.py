"""What the outbox counts, and the gauges it reads from the database when Prometheus scrapes.

Served by :mod:`django_idempotency_outbox.metrics` (the ``[metrics]`` extra). A
counter costs one settings lookup when metrics are off; the gauges that need SQL
are read at scrape time (:class:`OutboxCollector`), never kept up to date.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from django_idempotency_outbox.metrics import Instruments, add_collector, upkeep

__all__ = [
    "OutboxCollector", "consumed", "instruments", "parked", "register", "relayed",
    "upkeep",
]

logger = logging.getLogger("outbox")


class OutboxInstruments(Instruments):
    def __init__(self) -> None:
        from prometheus_client import Counter

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
        self._published_by_topic: dict[str, Callable[[], None]] = {}

    def published_count(self, topic: str) -> Callable[[], None]:
        """What counts one message of ``topic`` as published (kept per topic: ``labels()``
        takes a lock, and ``publish()`` asks for every message)."""
        count = self._published_by_topic.get(topic)
        if count is None:
            count = self._published_by_topic[topic] = self.published.labels(topic).inc
        return count


def instruments() -> OutboxInstruments | None:
    """The outbox's counters, or None when metrics are off or prometheus_client is missing."""
    return OutboxInstruments.get()


def register() -> None:
    """Make the counters now and read the gauges at every scrape (``OutboxConfig.ready()``).

    Not on a process's first count: a Celery pool process or a gunicorn
    worker forked after this inherits them, and no request or task pays for
    importing prometheus_client.
    """
    instruments()
    add_collector(OutboxCollector)


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


_hinted: set[str] = set()


def _hint_once(alias: str) -> None:
    """Say once per process and alias what the blocker's age needs."""
    if alias in _hinted:
        return
    _hinted.add(alias)
    from django.db import connections

    role = connections[alias].settings_dict.get("USER") or "the role of " + repr(alias)
    logger.warning(
        "metrics: an open transaction that published holds delivery back, and its start is "
        "hidden from %s: dio_outbox_blocker_age_seconds is NaN until a superuser runs GRANT "
        "pg_read_all_stats TO %s (dio_outbox_blockers counts it meanwhile)", role, role)


class OutboxCollector:
    """Reads the outbox's gauges from the database when Prometheus scrapes.

    One scrape is :func:`outbox.observe`: a handful of indexed queries on one
    connection of ``TENANCY["ADMIN_DATABASE"]`` (closed afterwards: a scrape
    may run in a thread of its own). If the database cannot be read, the
    scrape still answers, with ``dio_outbox_scrape_ok 0`` and without the
    gauges.
    """

    def collect(self) -> Iterator[Any]:
        from django.db import connections
        from prometheus_client.core import GaugeMetricFamily

        from outbox.observation import observe
        from tenancy.aliases import admin_alias

        def gauge(name: str, documentation: str, *labels: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, labels=list(labels))

        ok = gauge("dio_outbox_scrape_ok", "1 when the outbox gauges were read.")
        try:
            alias = admin_alias()
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
        behind = gauge("dio_outbox_lag_messages", "Committed messages a reader has not passed "
                       "yet (held back or not).", "reader", "partition")
        lag = gauge("dio_outbox_lag_seconds", "Age of the first committed message a reader has "
                    "not passed (0: none).", "reader", "partition")
        lease = gauge("dio_outbox_relay_lease_seconds", "Seconds left on a relay's lease; "
                      "negative once it has run out (a relay died).", "relay")
        for r in seen.readers:
            labels = [r.name, str(r.partition)]
            behind.add_metric(labels, r.behind)
            lag.add_metric(labels, r.lag.total_seconds() if r.lag else 0.0)
            if r.is_relay and r.lease_left is not None:
                lease.add_metric([r.name.removeprefix("relay:")], r.lease_left)
        held = gauge("dio_outbox_held_back_messages", "Committed messages waiting for an open "
                     "transaction that published for their tenant to end.")
        held.add_metric([], seen.held_back)
        blockers = gauge("dio_outbox_blockers", "Open transactions that published; each holds "
                         "back its own tenants' later messages (needs no privilege).")
        blockers.add_metric([], len(seen.publishers))
        age = gauge("dio_outbox_blocker_age_seconds", "Age of the oldest open transaction that "
                    "published (0: none; NaN: one is open but its start is hidden, GRANT "
                    "pg_read_all_stats to the admin alias's role).")
        ages = [p.age.total_seconds() for p in seen.publishers if p.age is not None]
        unseen = [p for p in seen.publishers if p.age is None and p.pid is not None]
        age.add_metric([], float("nan") if unseen and not ages else max(ages, default=0.0))
        if unseen:
            _hint_once(alias)
        parked_now = gauge("dio_outbox_parked_messages", "Messages in the dead-letter table, by "
                           "consumer.", "consumer")
        for name, count in sorted(seen.parked.items()):
            parked_now.add_metric([name], count)
        yield from (behind, lag, lease, held, blockers, age, parked_now)
