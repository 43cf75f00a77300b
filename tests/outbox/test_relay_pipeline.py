"""The relay's read-ahead changes its speed, never what it delivers.

The relay reads its next batch on a thread of its own while the broker takes
the current one (``outbox.relay._ReadAhead``): a read made for a position the
round does not end at is dropped, and the thread's connection is closed when
the relay stops.
"""

from __future__ import annotations

from typing import Any

import pytest

from outbox.relay import Relay, _ReadAhead
from outbox.stream import Position
from outbox.testing import InMemoryTransport
from tenancy.aliases import system_alias
from tests.helpers import observer
from tests.outbox.support.helpers import publish_many, wait_for

A = 1


def test_a_relay_reads_ahead_and_sends_everything_once_in_order():
    ids = publish_many(A, "t", [{"n": n} for n in range(95)])
    memory = InMemoryTransport()
    relay = Relay(memory, name="ahead", batch_size=10)
    taken: list[bool] = []
    original = _ReadAhead.take

    def spy(self: _ReadAhead, position: Position) -> Any:
        batch = original(self, position)
        taken.append(batch is not None)
        return batch

    _ReadAhead.take = spy  # type: ignore[method-assign]
    try:
        wait_for(lambda: relay.drain() >= 0 and len(memory.sent) >= 95, "relayed")
    finally:
        _ReadAhead.take = original  # type: ignore[method-assign]
    assert memory.message_ids == [str(i) for i in ids]
    assert sum(taken) >= 8  # the batches after a full one came from the read-ahead


def test_a_read_ahead_for_another_position_is_dropped_after_a_broker_failure():
    ids = publish_many(A, "t", [{"n": n} for n in range(30)])
    memory = InMemoryTransport(failures=1)  # the first batch fails once; its read-ahead is dropped
    relay = Relay(memory, name="ahead-fail", batch_size=10)
    wait_for(lambda: relay.drain() >= 0 and len(memory.sent) >= 30, "relayed")
    assert memory.message_ids == [str(i) for i in ids]  # each once, in order
    assert memory.calls == 4


def system_sessions() -> int:
    from django.conf import settings

    role = settings.DATABASES[system_alias()]["USER"]
    with observer() as conn:
        return int(conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND pid <> pg_backend_pid()",
            [role]).fetchone()[0])


@pytest.mark.direct_sessions("system", reason="counts the system role's server sessions")
def test_the_read_ahead_thread_closes_its_connection_when_the_relay_stops():
    publish_many(A, "t", [{"n": n} for n in range(25)])
    before = system_sessions()
    memory = InMemoryTransport()
    relay = Relay(memory, name="ahead-close", batch_size=10)
    wait_for(lambda: relay.drain() >= 0 and len(memory.sent) >= 25, "relayed")
    # The relay's own connection stays (Django's, this thread's); the read-ahead's is gone.
    wait_for(lambda: system_sessions() <= before + 1, "the read-ahead's session closed")
