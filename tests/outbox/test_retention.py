"""Retention: old messages go, but never one that a reader has not passed."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, transaction
from django.db.models.functions import Now

from outbox.relay import Relay
from outbox.retention import reap
from outbox.testing import InMemoryTransport
from tenancy import tenant_context
from tenancy.aliases import app_alias, system_alias
from tests.helpers import count_rows, observer, wait_for_lock_wait
from tests.outbox.factories import ReceivedMessageFactory
from tests.outbox.support.helpers import (
    drain,
    effects,
    publish_many,
    recorder,
    wait_for,
)
from tests.outbox.support.recorders import OrderRecorder, PartitionedRecorder, SlowRecorder

A = 1


def age_everything(days: int = 30) -> None:
    with observer() as conn:
        conn.execute(f"UPDATE outbox_messages SET created_at = now() - interval '{days} days'")


@pytest.fixture
def only_orders(settings):
    settings.OUTBOX = {**settings.OUTBOX, "CONSUMERS": [recorder("OrderRecorder")],
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
    from tests.outbox.support.helpers import raw_publish

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
        recorder("OrderRecorder"), recorder("SlowRecorder")]}
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
                       "CONSUMERS": [recorder("PartitionedRecorder")]}
    publish_many(A, "order.sequenced", [{"sku": f"k{i}", "seq": 0} for i in range(8)],
                 key=lambda p: p["sku"])
    drain(PartitionedRecorder(), until=lambda: len(effects()) == 8)
    with observer() as conn:  # one partition falls back to the start
        conn.execute("UPDATE consumer_offsets SET last_id = 0"
                     " WHERE name = 'orders-partitioned' AND partition = 0")
    age_everything()
    assert reap().messages == 0


@contextlib.contextmanager
def deletes() -> Iterator[list[tuple[str, int]]]:
    """(table, rows deleted) of each DELETE retention sends (each its own transaction)."""
    seen: list[tuple[str, int]] = []
    connection = connections[system_alias()]

    def capture(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        table = re.search(r"DELETE FROM (\w+)", sql)
        if table:
            seen.append((table[1], context["cursor"].rowcount))
        return result

    with connection.execute_wrapper(capture):
        yield seen


def test_reaping_deletes_in_bounded_batches(only_orders):
    publish_many(A, "order.placed", [{"sku": f"s{i}"} for i in range(25)])
    drain(OrderRecorder(), until=lambda: len(effects()) == 25)
    age_everything()
    with deletes() as batches:
        assert reap(batch_size=10).messages == 25
    assert batches == [("outbox_messages", 10), ("outbox_messages", 10), ("outbox_messages", 5)]
    assert count_rows("outbox_messages") == 0


def test_two_reapers_at_once_delete_each_row_once(only_orders):
    """docs/operations.md: two at once pick from the same rows; a row is deleted once.

    The first reaper's first batch is held uncommitted (its batches run in a transaction the
    test keeps open) while the second picks the same rows and waits for them."""
    publish_many(A, "order.placed", [{"sku": f"s{i}"} for i in range(25)])
    drain(OrderRecorder(), until=lambda: len(effects()) == 25)
    age_everything()
    first_batch, go_on = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def hold_after_the_first_delete(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "DELETE FROM outbox_messages" in sql and not first_batch.is_set():
            first_batch.set()
            go_on.wait(60)
        return result

    def first() -> None:
        alias = system_alias()
        try:
            with connections[alias].execute_wrapper(hold_after_the_first_delete), \
                    transaction.atomic(using=alias):
                results["first"] = reap(batch_size=10)
        except Exception as exc:  # reported below
            results["first"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert first_batch.wait(60), results

        def second() -> None:
            try:
                results["second"] = reap(batch_size=10)
            except Exception as exc:  # reported below
                results["second"] = exc
            finally:
                connections.close_all()

        other = threading.Thread(target=second)
        other.start()
        wait_for_lock_wait(system_alias())  # the second waits for the rows the first holds
    finally:
        go_on.set()
        thread.join(60)
    other.join(60)
    assert not thread.is_alive() and not other.is_alive()
    done = [results["first"], results["second"]]
    assert not any(isinstance(r, Exception) for r in done), done
    assert sum(r.messages for r in done) == 25  # each row deleted once, by one of them
    assert count_rows("outbox_messages") == 0


def test_old_receiver_records_are_forgotten_in_bounded_batches(settings):
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION": 3600}
    two_hours_ago = Now() - timedelta(hours=2)
    with tenant_context(1):
        ReceivedMessageFactory.create_batch(4, received_at=two_hours_ago)
        ReceivedMessageFactory()  # just now: kept
    with tenant_context(2):
        ReceivedMessageFactory.create_batch(3, received_at=two_hours_ago)
    with deletes() as batches:
        assert reap(batch_size=2).received == 7
    assert sorted(n for table, n in batches if table == "outbox_received") == [
        0, 1, 2, 2, 2]  # tenant 1: 2, 2, 0; tenant 2: 2, 1
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
