"""Gap-safe offsets: a message committed late is delivered, never skipped.

Transaction 1 takes a message id and stays open; transaction 2 takes a higher
id and commits. A reader of ``WHERE id > last_processed_id`` (the reference
snippet's consumer) reads id 2, moves past it, and never sees id 1 when
transaction 1 commits. The library's readers follow ids in order below the
publisher fence of each tenant (of a tenant with a transaction still
publishing, no id above that transaction's bound), so both messages are
handled, once; a transaction that published nothing holds nothing back, and
one that did holds back only its own tenants (tests/outbox/test_fence.py).
"""

from __future__ import annotations

from django.db import connections

from outbox.relay import Relay
from outbox.testing import InMemoryTransport
from tenancy.aliases import system_alias
from tests.helpers import observer, two_connections
from tests.outbox.support.helpers import drain, effects, raw_publish, wait_for
from tests.outbox.support.recorders import OrderRecorder

A, B = 1, 2


class IdReader:
    """The reference snippet's consumer: ``WHERE id > last_processed_id ORDER BY id``."""

    def __init__(self) -> None:
        self.last_processed_id = 0
        self.seen: list[int] = []

    def poll(self) -> None:
        with connections[system_alias()].cursor() as cursor:
            cursor.execute(
                "SELECT id FROM outbox_messages WHERE id > %s ORDER BY id LIMIT 100",
                [self.last_processed_id],
            )
            ids = [row[0] for row in cursor.fetchall()]
        self.seen += ids
        if ids:
            self.last_processed_id = ids[-1]


def test_an_id_reader_loses_a_message_committed_out_of_order():
    reader = IdReader()
    with two_connections() as (t1, t2):
        with t1.transaction():
            first, _ = raw_publish(t1, A, "order.placed", {"sku": "first"})
            with t2.transaction():
                second, _ = raw_publish(t2, B, "order.placed", {"sku": "second"})
            reader.poll()  # sees the second message only: the first is uncommitted
        reader.poll()
        reader.poll()
    assert first < second
    assert reader.seen == [second]  # the first message is lost for good


def test_a_consumer_handles_out_of_order_commits_exactly_once():
    consumer = OrderRecorder()
    with two_connections() as (t1, t2):
        with t1.transaction():
            _, first = raw_publish(t1, A, "order.placed", {"sku": "first"})
            with t2.transaction():
                _, second = raw_publish(t2, A, "order.placed", {"sku": "second"})
            drain(consumer)
            assert effects() == {}  # held behind its tenant's open transaction, not skipped
        drain(consumer, until=lambda: len(effects()) == 2)
    drain(consumer)
    assert effects() == {str(first): 1, str(second): 1}


def test_the_relay_sends_out_of_order_commits_exactly_once():
    memory = InMemoryTransport()
    relay = Relay(memory, name="test")
    with two_connections() as (t1, t2):
        with t1.transaction():
            _, first = raw_publish(t1, A, "order.placed", {"sku": "first"})
            with t2.transaction():
                _, second = raw_publish(t2, A, "order.placed", {"sku": "second"})
            relay.drain()
            assert memory.sent == []
        wait_for(lambda: relay.drain() >= 0 and len(memory.sent) == 2, "both messages relayed")
    relay.drain()
    assert memory.message_ids == [str(first), str(second)]  # id order


def test_out_of_order_commits_beside_an_unrelated_long_transaction_are_each_delivered_once():
    """The unrelated transaction (it wrote, so it has an xid) is open throughout:
    the first message waits only for its own transaction, not for it."""
    consumer = OrderRecorder()
    memory = InMemoryTransport()
    relay = Relay(memory, name="test")
    with observer() as unrelated, two_connections() as (t1, t2):
        unrelated.execute("BEGIN")
        unrelated.execute("CREATE TEMP TABLE long_work (n int); INSERT INTO long_work VALUES (1)")
        with t1.transaction():
            _, first = raw_publish(t1, A, "order.placed", {"sku": "first"})
            with t2.transaction():
                _, second = raw_publish(t2, A, "order.placed", {"sku": "second"})
            drain(consumer)
            relay.drain()
            assert effects() == {} and memory.sent == []  # the second waits for the first
        drain(consumer, until=lambda: len(effects()) == 2)
        wait_for(lambda: relay.drain() >= 0 and len(memory.sent) == 2, "both relayed")
        assert unrelated.execute(
            "SELECT pg_current_xact_id_if_assigned() IS NOT NULL").fetchone()[0]  # still open
        unrelated.execute("ROLLBACK")
    drain(consumer)
    relay.drain()
    assert effects() == {str(first): 1, str(second): 1}
    assert memory.message_ids == [str(first), str(second)]
