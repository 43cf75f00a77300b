"""Rewinding the relay: a way back after a broker lost messages it had been sent.

``relay_outbox --rewind-to`` sets the relay's position (the id of the last
message it passed) back to just before the target; the relay sends everything
from there again, in id order, and receivers skip what they had handled.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from outbox.exceptions import RewindRefused
from outbox.relay import Relay, rewind
from outbox.testing import InMemoryTransport
from tests.helpers import observer, set_tenant, two_connections
from tests.outbox.support.helpers import offset, publish_as, publish_many, wait_for

A, B = 1, 2


def sent_all(relay: Relay, memory: InMemoryTransport, count: int) -> None:
    wait_for(lambda: relay.drain() >= 0 and len(memory.sent) >= count, f"{count} sent")


def database_now():
    with observer() as conn:
        return conn.execute("SELECT now()").fetchone()[0]


def age(message_id: uuid.UUID, by: timedelta) -> None:
    """Make a message look published ``by`` earlier."""
    with observer() as conn:
        conn.execute("UPDATE outbox_messages SET created_at = created_at - %s"
                     " WHERE message_id = %s", [by, message_id])


def relay_all(*ids: uuid.UUID) -> tuple[Relay, InMemoryTransport]:
    memory = InMemoryTransport()
    relay = Relay(memory)
    sent_all(relay, memory, len(ids))
    assert memory.message_ids == [str(i) for i in ids]
    return relay, memory


def test_rewinding_to_a_message_sends_it_and_everything_after_it_again():
    ids = publish_many(A, "order.placed", [{"n": n} for n in range(5)])
    ids += publish_many(B, "order.paid", [{"n": n} for n in range(3)])
    relay, memory = relay_all(*ids)
    done = rewind(ids[3])
    assert done.moved and done.resend == {"order.paid": 3, "order.placed": 2}
    assert done.target.message_id == ids[3]
    again = InMemoryTransport()  # a relay started after the rewind
    sent_all(Relay(again), again, 5)
    assert again.message_ids == [str(i) for i in ids[3:]]


def test_rewinding_to_a_time_sends_everything_published_since_again():
    early = publish_many(A, "order.placed", [{"n": n} for n in range(3)])
    since = database_now()
    late = publish_many(A, "order.placed", [{"n": n} for n in range(4)])
    relay_all(*early, *late)
    done = rewind(since)
    assert done.count == 4 and done.target.message_id == late[0]
    again = InMemoryTransport()
    sent_all(Relay(again), again, 4)
    assert again.message_ids == [str(i) for i in late]


def test_a_dry_run_counts_per_topic_and_changes_nothing():
    ids = publish_many(A, "order.placed", [{"n": 1}, {"n": 2}])
    ids += publish_many(A, "order.paid", [{"n": 3}])
    relay_all(*ids)
    before = offset("relay:default")
    out = io.StringIO()
    call_command("relay_outbox", "--rewind-to", str(ids[0]), "--dry-run", stdout=out)
    assert out.getvalue().strip() == (
        f"relay default: --dry-run: rewinding to message {ids[0]} (published "
        f"{published(ids[0])}) would send 3 message(s) again: order.paid 1, order.placed 2"
    )
    assert offset("relay:default") == before


def created_at(message_id: uuid.UUID):
    with observer() as conn:
        return conn.execute("SELECT created_at FROM outbox_messages WHERE message_id = %s",
                            [message_id]).fetchone()[0]


def published(message_id: uuid.UUID) -> str:
    return created_at(message_id).isoformat()


def test_the_command_rewinds_and_says_what_will_be_sent_again():
    ids = publish_many(A, "order.placed", [{"n": 1}, {"n": 2}])
    relay_all(*ids)
    out = io.StringIO()
    call_command("relay_outbox", "--rewind-to", str(ids[1]), stdout=out)
    assert "rewound to message" in out.getvalue()
    assert "1 message(s) will be sent again: order.placed 1" in out.getvalue()
    assert offset("relay:default")[0] == ids_row_id(ids[1]) - 1  # just before it, by id


def ids_row_id(message_id: uuid.UUID) -> int:
    with observer() as conn:
        return conn.execute("SELECT id FROM outbox_messages WHERE message_id = %s",
                            [message_id]).fetchone()[0]


def test_a_time_includes_messages_published_a_little_earlier_that_sort_after_it():
    # created_at is the publishing statement's start (STATEMENT_TIMESTAMP()); the
    # order is by id, taken as the row is written. A statement that started
    # before the time and took its id after a message published since sorts
    # after that message, so it is sent again too.
    earlier = uuid.uuid4()
    with observer() as gate, two_connections() as (early, _):
        gate.execute("SELECT pg_advisory_lock(%s)", [GATE])

        def publish_behind_the_gate() -> None:
            with early.transaction():
                set_tenant(early, A)
                early.execute(  # the row, and so its id, is made once the gate opens
                    "INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
                    " SELECT %s, %s, 'order.placed', '{}'::jsonb"
                    "   FROM (SELECT pg_advisory_xact_lock_shared(%s)) AS gate",
                    [A, earlier, GATE],
                )

        thread = threading.Thread(target=publish_behind_the_gate)
        thread.start()
        try:
            wait_for(waiting_at_the_gate, "the early statement to wait at the gate")
            since = database_now()
            late = publish_as(A, "order.placed", {"n": "late"})
        finally:
            gate.execute("SELECT pg_advisory_unlock(%s)", [GATE])
            thread.join(60)
    relay_all(late, earlier)  # id order: the earlier statement's message last
    assert created_at(earlier) < since <= created_at(late)
    done = rewind(since)
    assert done.target.message_id == late and done.count == 2
    again = InMemoryTransport()
    sent_all(Relay(again), again, 2)
    assert again.message_ids == [str(late), str(earlier)]


#: An advisory lock key of this test's own (one bigint: never one of the outbox's).
GATE = 7_340_001


def waiting_at_the_gate() -> bool:
    with observer() as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND classid = 0 AND objid = %s AND objsubid = 1", [GATE],
        ).fetchone()[0] == 1


def relay_position() -> int | None:
    """The id of the last message the relay passed (None before it first ran)."""
    row = offset("relay:default")
    return None if row is None else row[0]


@contextlib.contextmanager
def running(relay: Relay) -> Iterator[Relay]:
    """``relay.run()`` in a thread, as ``relay_outbox`` runs it, until the block ends."""

    def run() -> None:
        try:
            relay.run()
        finally:
            connections.close_all()  # this thread's own

    thread = threading.Thread(target=run, name="relay under test")
    thread.start()
    try:
        yield relay
    finally:
        relay.stop.set()
        thread.join(60)
        assert not thread.is_alive()


def test_a_running_relay_carries_on_from_the_rewound_position(caplog):
    ids = publish_many(A, "order.placed", [{"n": n} for n in range(4)])
    memory = InMemoryTransport()
    with caplog.at_level(logging.WARNING, logger="outbox"), running(Relay(memory)):
        # It holds its lease (its heartbeat renews it) and remembers its position.
        wait_for(lambda: relay_position() == ids_row_id(ids[-1]), "4 sent")
        rewind(ids[1])
        # Nothing new is published, so the relay never advances: only its
        # heartbeat, finding the lease dropped, can make it read its position
        # again. Renewing the lease instead would keep the remembered position,
        # and nothing would be sent again.
        wait_for(lambda: len(memory.sent) == 4 + 3, "sent again from the rewound position")
        newer = publish_as(A, "order.placed", {"n": 4})
        wait_for(lambda: relay_position() == ids_row_id(newer), "the relay to advance")
    assert memory.message_ids == [str(i) for i in [*ids, *ids[1:], newer]]
    assert "lost its lease to another relay (or a rewind dropped it)" in caplog.text
    assert "lost its lease while sending" not in caplog.text


def steps_until(relay: Relay, memory: InMemoryTransport, count: int) -> None:
    """Rounds of ``relay`` (as its loop runs them) until ``count`` messages went out."""
    wait_for(lambda: relay.step() in (True, False) and len(memory.sent) >= count,
             f"{count} sent")


def test_a_round_under_way_when_the_relay_is_rewound_cannot_advance(settings, caplog):
    # A lease of 10 minutes: the heartbeat (every 2.5 minutes) does not notice the
    # rewind during this test, so the relay's next round still starts from the
    # position it remembers, as one under way at the rewind would.
    settings.OUTBOX = {**settings.OUTBOX, "RELAY_LEASE": timedelta(minutes=10)}
    ids = publish_many(A, "order.placed", [{"n": n} for n in range(3)])
    memory = InMemoryTransport()
    relay = Relay(memory)
    try:
        steps_until(relay, memory, 3)
        rewind(ids[0])
        newer = publish_as(A, "order.placed", {"n": 3})
        assert relay._heartbeat is not None and not relay._heartbeat.lost.is_set()
        with caplog.at_level(logging.WARNING, logger="outbox"):
            steps_until(relay, memory, 4)  # sends the newer one, after the old position...
        assert "lost its lease while sending" in caplog.text
        # ...but cannot move the offset: its compare-and-set on the old position
        # and its lease fails, and the rewound position stands.
        assert offset("relay:default")[0] == ids_row_id(ids[0]) - 1
        steps_until(relay, memory, 4 + 4)  # it reads its position again: from the rewind
        assert memory.message_ids[3:] == [str(newer)] + [str(i) for i in [*ids, newer]]
        assert offset("relay:default")[0] == ids_row_id(newer)
    finally:
        relay.release()


def test_it_never_moves_the_relay_forward():
    ids = publish_many(A, "order.placed", [{"n": 1}])
    before = offset("relay:default")
    done = rewind(ids[0])  # the relay has not run: it has nothing to send again
    assert not done.moved and "has not run yet" in done.note
    relay_all(*ids)
    later = publish_as(A, "order.placed", {"n": 2})
    done = rewind(later)  # not sent yet
    assert not done.moved and "has not sent" in done.note
    assert offset("relay:default") != before and offset("relay:default")[0] == ids_row_id(ids[0])


def test_an_unknown_message_is_refused():
    missing = uuid.uuid4()
    with pytest.raises(CommandError, match=f"message {missing} is not in the outbox"):
        call_command("relay_outbox", "--rewind-to", str(missing))


def test_a_time_older_than_retention_is_refused_naming_what_may_be_missing(settings):
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION": timedelta(hours=1)}
    ids = publish_many(A, "order.placed", [{"n": 1}])
    relay_all(*ids)
    with pytest.raises(RewindRefused) as refused:
        rewind(database_now() - timedelta(hours=2))
    text = str(refused.value)
    assert "older than what the outbox keeps" in text
    assert f"the oldest message kept is {ids[0]}" in text
    assert "may be missing" in text
    assert "receivers have forgotten their ids" in text  # they remember as long (RETENTION)
    age(ids[0], timedelta(hours=2))  # a message id older than retention: refused too
    with pytest.raises(RewindRefused, match="older than what the outbox keeps"):
        rewind(ids[0])


def test_a_time_without_a_time_zone_or_a_bad_value_is_refused():
    with pytest.raises(CommandError, match="has no time zone"):
        call_command("relay_outbox", "--rewind-to", "2026-11-23T08:00:00")
    with pytest.raises(CommandError, match="neither a message id"):
        call_command("relay_outbox", "--rewind-to", "yesterday")
    with pytest.raises(CommandError, match="--dry-run goes with --rewind-to"):
        call_command("relay_outbox", "--dry-run")
