"""The loops' pauses, as the loops ask for them (docs/operations.md).

A relay or consumer loop that loses the database retries after 1 s, doubled
for each further failure up to 30 s; a relay whose broker fails, after 0.5 s,
doubled up to 30 s. Each loop here runs for real, in this process, against a
database it then loses (its aliases pointed at a port nobody listens on) or
a broker that keeps failing; its stop event records each pause the loop asks
it to wait, and returns at once, so the schedule is measured without the
minutes it describes. ``test_processes.py`` sees the first pauses of a real
process in its log.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

import pytest

from outbox.consumers import ensure_offsets, run_consumers
from outbox.relay import Relay
from outbox.testing import InMemoryTransport
from tenancy.aliases import system_alias, worker_alias
from tests.live import free_port
from tests.outbox.support.helpers import effects, publish_as
from tests.outbox.support.recorders import OrderRecorder
from tests.pooler import connection_settings

DATABASE = [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
BROKER = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


class Schedule(threading.Event):
    """A loop's stop event: records each pause asked of it and returns at once.

    ``lose`` runs before the loop's first step; once ``len(pauses)`` pauses were
    asked, ``recover`` runs, and the loop is stopped after its next round.
    """

    def __init__(self, pauses: int, lose: Callable[[], None] = lambda: None,
                 recover: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.pauses: list[float] = []
        self._expected, self._lose, self._recover = pauses, lose, recover
        self._checks = 0
        self._after_recovery = 0

    def is_set(self) -> bool:
        self._checks += 1
        if self._checks == 1:
            self._lose()
        if len(self.pauses) >= self._expected:
            self._after_recovery += 1
            if self._after_recovery > 2:  # the round after the recovery is done
                self.set()
        return super().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        self.pauses.append(float(timeout or 0))
        assert len(self.pauses) <= self._expected + 2, f"kept pausing: {self.pauses}"
        if len(self.pauses) == self._expected:
            self._recover()
        return super().is_set()


@contextlib.contextmanager
def database_lost(*aliases: str):
    """Lose and recover the database for ``aliases``: (lose, recover) for a Schedule."""
    stack = contextlib.ExitStack()
    dead = str(free_port())  # nothing listens there: every connection is refused

    def lose() -> None:
        for alias in aliases:
            stack.enter_context(connection_settings(alias, HOST="127.0.0.1", PORT=dead))

    with stack:
        yield lose, stack.close


@pytest.fixture
def lost_log(caplog):
    caplog.set_level(logging.INFO, logger="outbox")
    return caplog


def retries(caplog, what: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if what in r.getMessage()]


def test_the_consumer_loop_retries_a_lost_database_after_1_s_doubling_to_30_s(lost_log):
    consumer = OrderRecorder()
    ensure_offsets(consumer)
    with database_lost(worker_alias(), system_alias()) as (lose, recover):
        schedule = Schedule(len(DATABASE), lose, recover)
        run_consumers([consumer], stop=schedule)
    assert schedule.pauses == DATABASE
    lost = retries(lost_log, "lost the database")
    assert [line.rsplit("retrying in ", 1)[1] for line in lost] == [
        f"{p:.1f} s" for p in DATABASE]
    assert retries(lost_log, "run_consumers is back on the database")
    publish_as(1, "order.placed", {"sku": "after"})  # and the database works for it again
    assert run_consumers([consumer], once=True) == 1 and len(effects()) == 1


def test_the_relay_loop_retries_a_lost_database_after_1_s_doubling_to_30_s(lost_log):
    relay = Relay(InMemoryTransport(), name="backoff")
    with database_lost(worker_alias(), system_alias()) as (lose, recover):
        relay.stop = Schedule(len(DATABASE), lose, recover)
        relay.run()
    assert relay.stop.pauses == DATABASE
    assert len(retries(lost_log, "relay backoff lost the database")) == len(DATABASE)
    assert retries(lost_log, "relay backoff is back on the database")


def test_the_relay_retries_a_failing_broker_after_half_a_second_doubling_to_30_s(lost_log):
    message = publish_as(1, "order.placed", {"sku": "held"})
    transport = InMemoryTransport(failures=len(BROKER))
    relay = Relay(transport, name="backoff")
    relay.stop = Schedule(len(BROKER))
    relay.run()
    assert relay.stop.pauses == BROKER
    assert [line.rsplit("sending them again in ", 1)[1]
            for line in retries(lost_log, "could not send")] == [f"{p:.1f} s" for p in BROKER]
    assert transport.message_ids == [str(message)]  # sent once the broker took it, once
    assert retries(lost_log, "reaches the broker again")
