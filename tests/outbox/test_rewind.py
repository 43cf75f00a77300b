"""Rewinding the relay: a way back after a broker lost messages it had been sent.

``relay_outbox --rewind-to`` sets the relay's position back; the relay sends
everything from there again, and receivers skip what they had handled.
"""

from __future__ import annotations

import io
import uuid
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command

from outbox.exceptions import RewindRefused
from outbox.relay import Relay, rewind
from outbox.testing import InMemoryTransport
from tests.helpers import observer
from tests.outbox.helpers import offset, publish_as, publish_many, wait_for

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


def published(message_id: uuid.UUID) -> str:
    with observer() as conn:
        return conn.execute("SELECT created_at FROM outbox_messages WHERE message_id = %s",
                            [message_id]).fetchone()[0].isoformat()


def test_the_command_rewinds_and_says_what_will_be_sent_again():
    ids = publish_many(A, "order.placed", [{"n": 1}, {"n": 2}])
    relay_all(*ids)
    out = io.StringIO()
    call_command("relay_outbox", "--rewind-to", str(ids[1]), stdout=out)
    assert "rewound to message" in out.getvalue()
    assert "1 message(s) will be sent again: order.placed 1" in out.getvalue()
    assert offset("relay:default")[1] == int(ids_row_id(ids[1])) - 1


def ids_row_id(message_id: uuid.UUID) -> int:
    with observer() as conn:
        return conn.execute("SELECT id FROM outbox_messages WHERE message_id = %s",
                            [message_id]).fetchone()[0]


def test_a_running_relay_carries_on_from_the_rewound_position():
    ids = publish_many(A, "order.placed", [{"n": n} for n in range(3)])
    relay, memory = relay_all(*ids)  # this relay keeps its lease and its position in memory
    rewind(ids[0])
    newer = publish_as(A, "order.placed", {"n": 3})
    # Its next advance is refused (the position and the lease moved under it);
    # it reads again from the rewound position.
    sent_all(relay, memory, 3 + 1 + 4)
    assert memory.message_ids[3:] == [str(newer)] + [str(i) for i in [*ids, newer]]


def test_it_never_moves_the_relay_forward():
    ids = publish_many(A, "order.placed", [{"n": 1}])
    before = offset("relay:default")
    done = rewind(ids[0])  # the relay has not run: it has nothing to send again
    assert not done.moved and "has not run yet" in done.note
    relay_all(*ids)
    later = publish_as(A, "order.placed", {"n": 2})
    done = rewind(later)  # not sent yet
    assert not done.moved and "has not sent" in done.note
    assert offset("relay:default") != before and offset("relay:default")[1] == ids_row_id(ids[0])


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
    age(ids[0], timedelta(hours=2))  # a message id older than retention: refused too
    with pytest.raises(RewindRefused, match="older than what the outbox keeps"):
        rewind(ids[0])


def test_a_time_older_than_receivers_remember_is_refused(settings):
    settings.OUTBOX = {**settings.OUTBOX, "RECEIVED_RETENTION": timedelta(hours=1)}
    ids = publish_many(A, "order.placed", [{"n": 1}])
    relay_all(*ids)
    with pytest.raises(CommandError, match="effects run a second time"):
        call_command("relay_outbox", "--rewind-to",
                     (database_now() - timedelta(hours=2)).isoformat())


def test_a_time_without_a_time_zone_or_a_bad_value_is_refused():
    with pytest.raises(CommandError, match="has no time zone"):
        call_command("relay_outbox", "--rewind-to", "2026-11-23T08:00:00")
    with pytest.raises(CommandError, match="neither a message id"):
        call_command("relay_outbox", "--rewind-to", "yesterday")
    with pytest.raises(CommandError, match="--dry-run goes with --rewind-to"):
        call_command("relay_outbox", "--dry-run")
