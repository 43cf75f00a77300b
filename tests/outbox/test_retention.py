"""Retention: old messages go, but never one that a reader has not passed."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from outbox.relay import Relay
from outbox.retention import reap
from outbox.testing import InMemoryTransport
from tenancy.aliases import app_alias
from tests.helpers import count_rows, observer
from tests.outbox.consumers import OrderRecorder, PartitionedRecorder, SlowRecorder
from tests.outbox.helpers import drain, effects, publish_many, wait_for

A = 1


def age_everything(days: int = 30) -> None:
    with observer() as conn:
        conn.execute(f"UPDATE outbox_messages SET created_at = now() - interval '{days} days'")


@pytest.fixture
def only_orders(settings):
    settings.OUTBOX = {**settings.OUTBOX, "CONSUMERS": ["tests.outbox.consumers.OrderRecorder"],
                       "TRANSPORT": None}


def test_retention_never_deletes_a_message_a_consumer_has_not_passed(only_orders):
    handled = publish_many(A, "order.placed", [{"sku": "a"}, {"sku": "b"}])
    drain(OrderRecorder(), until=lambda: len(effects()) == 2)
    pending = publish_many(A, "order.placed", [{"sku": "c"}])  # not consumed yet
    age_everything()
    result = reap()
    assert result.messages == 2
    with observer() as conn:
        left = [r[0] for r in conn.execute("SELECT message_id FROM outbox_messages")]
    assert left == pending
    drain(OrderRecorder(), until=lambda: len(effects()) == 3)
    assert effects()[str(pending[0])] == 1 and len(handled) == 2


def test_retention_never_deletes_a_held_tenants_message_the_reader_went_past(only_orders):
    """A reader passes other tenants while a publisher of tenant A is open: A's messages
    behind its position are not passed yet, and retention keeps them."""
    from tests.helpers import connect
    from tests.outbox.helpers import raw_publish

    B = 2
    with connect() as slow:
        slow.execute("BEGIN")
        raw_publish(slow, A, "order.placed", {"sku": "open"})
        waiting = publish_many(A, "order.placed", [{"sku": "waiting"}])  # committed, held back
        others = publish_many(B, "order.placed", [{"sku": "b1"}, {"sku": "b2"}])
        drain(OrderRecorder(), until=lambda: len(effects()) == 2)  # B's, past A's
        age_everything()
        result = reap()
        with observer() as conn:
            left = {r[0] for r in conn.execute("SELECT message_id FROM outbox_messages")}
        assert set(waiting) <= left and result.messages < len(others) + 1
        slow.execute("COMMIT")
    drain(OrderRecorder(), until=lambda: len(effects()) == 4)
    assert effects()[str(waiting[0])] == 1


def test_retention_keeps_passed_messages_inside_the_window(only_orders):
    publish_many(A, "order.placed", [{"sku": "a"}])
    drain(OrderRecorder(), until=lambda: len(effects()) == 1)
    assert reap().messages == 0
    assert count_rows("outbox_messages") == 1


def test_retention_waits_for_a_configured_consumer_that_never_ran(settings):
    settings.OUTBOX = {**settings.OUTBOX, "TRANSPORT": None, "CONSUMERS": [
        "tests.outbox.consumers.OrderRecorder", "tests.outbox.consumers.SlowRecorder"]}
    publish_many(A, "order.placed", [{"sku": "a"}])
    drain(OrderRecorder(), until=lambda: len(effects()) == 1)
    age_everything()
    assert reap().messages == 0  # orders-slow has no offset yet: it will start from the beginning
    drain(SlowRecorder())  # passes the message (not its topic) once the fence is beyond it
    wait_for(lambda: drain(SlowRecorder()) >= 0 and reap().messages == 1, "the reap")


def test_retention_waits_for_the_relay(settings):
    """Before any relay ran, for the default one; then for every relay that has run."""
    settings.OUTBOX = {**settings.OUTBOX, "CONSUMERS": []}
    publish_many(A, "t", [{"n": 1}])
    age_everything()
    assert reap().messages == 0  # relay:default has not run
    memory = InMemoryTransport()
    wait_for(lambda: Relay(memory, name="test").drain() >= 0 and bool(memory.sent), "relayed")
    assert reap().messages == 1  # relay:test passed it (no default relay is waited for now)
    publish_many(A, "t", [{"n": 2}])
    with observer() as conn:  # a second relay, which has run before and stays behind
        conn.execute("INSERT INTO consumer_offsets (name, partition, partition_count, last_id)"
                     " VALUES ('relay:other', 0, 1, 0)")
    wait_for(lambda: Relay(memory, name="test").drain() >= 0 and len(memory.sent) == 2,
             "relayed")
    age_everything()
    assert reap().messages == 0


def test_retention_waits_for_every_partition(settings):
    settings.OUTBOX = {**settings.OUTBOX, "TRANSPORT": None,
                       "CONSUMERS": ["tests.outbox.consumers.PartitionedRecorder"]}
    publish_many(A, "order.sequenced", [{"sku": f"k{i}", "seq": 0} for i in range(8)],
                 key=lambda p: p["sku"])
    drain(PartitionedRecorder(), until=lambda: len(effects()) == 8)
    with observer() as conn:  # one partition falls back to the start
        conn.execute("UPDATE consumer_offsets SET last_id = 0"
                     " WHERE name = 'orders-partitioned' AND partition = 0")
    age_everything()
    assert reap().messages == 0


def test_reaping_deletes_in_bounded_batches(only_orders):
    publish_many(A, "order.placed", [{"sku": f"s{i}"} for i in range(25)])
    drain(OrderRecorder(), until=lambda: len(effects()) == 25)
    age_everything()
    assert reap(batch_size=10).messages == 25
    assert count_rows("outbox_messages") == 0


def test_old_receiver_records_are_forgotten(settings):
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION": 3600}  # receivers' records too
    with observer() as conn:
        conn.execute(
            "INSERT INTO outbox_received (tenant_id, receiver, message_id, received_at)"
            " SELECT t, 'r', gen_random_uuid(), now() - interval '2 hours'"
            " FROM generate_series(1, 3) t"
            " UNION ALL SELECT 1, 'r', gen_random_uuid(), now()"
        )
    assert reap().received == 3
    assert count_rows("outbox_received") == 1


def test_reap_outbox_refuses_an_alias_under_row_level_security(settings):
    settings.TENANCY = {**settings.TENANCY, "SYSTEM_DATABASE": app_alias()}
    with pytest.raises(CommandError, match="row-level security"):
        call_command("reap_outbox")


def test_reap_outbox_command_reports(only_orders, capsys):
    call_command("reap_outbox")
    out = capsys.readouterr().out
    assert "deleted 0 message(s)" in out
    with pytest.raises(CommandError, match="at least 1"):
        call_command("reap_outbox", "--batch-size", "0")
