"""Claims of the outbox that an edit to the library once broke with the suite green.

Each test names the documented claim it holds and was watched failing on the
edit that breaks it (issue 9; mutants/catalogue.py keeps the edits and
``make mutants`` applies them again).
"""

from __future__ import annotations

import signal
import threading
import time
import uuid

import psycopg
import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connections

from outbox import Consumer, Message, tasks
from outbox.receivers import receive
from outbox.relay import Relay
from outbox.testing import InMemoryTransport
from tenancy import current_tenant_id, tenant_alias
from tenancy.aliases import system_alias, worker_alias
from tests.helpers import count_rows, observer
from tests.outbox.support.helpers import (
    SUBPROCESS_SETTINGS,
    Process,
    drain,
    effects,
    publish_many,
    wait_for,
)
from tests.testapp.models import Order

A = 1


# --- docs/consumers.md: the handler's writes and the offset advance commit together -------


class TransactionRecorder(Consumer):
    """Writes, with each message, the id of the (top-level) transaction handling it."""

    name = "claims-xact"
    topics = ["claims.xact"]

    def handle(self, message: Message) -> None:
        # Raw SQL through the batch's alias (docs/consumers.md); 32 bits, as xmin shows it.
        with connections[tenant_alias()].cursor() as cursor:
            cursor.execute("SELECT (pg_current_xact_id()::text::bigint % 4294967296)::text")
            (xact,) = cursor.fetchone()
        Order.objects.create(tenant_id=current_tenant_id(), sku=xact,
                             note=str(message.message_id))


def test_the_offset_advance_is_written_by_the_transaction_that_ran_the_handler():
    publish_many(A, "claims.xact", [{"n": n} for n in range(3)])
    drain(TransactionRecorder(), until=lambda: len(effects()) == 3)
    with observer() as conn:
        handlers = {sku for (sku,) in conn.execute("SELECT sku FROM testapp_order")}
        (offset_xmin,) = conn.execute(
            "SELECT xmin::text FROM consumer_offsets WHERE name = 'claims-xact'"
        ).fetchone()
    assert len(handlers) == 1, "one batch, one transaction"
    assert handlers == {offset_xmin}, (
        "the offset row was last written by another transaction than the handler's: "
        "a crash between the two commits would handle the batch again"
    )


class SmallBatches(Consumer):
    """Five messages a batch: a backlog of twelve takes three batches."""

    name = "claims-small-batches"
    topics = ["claims.backlog"]
    batch_size = 5

    def handle(self, message: Message) -> None:
        Order.objects.create(tenant_id=current_tenant_id(), sku="backlog",
                             note=str(message.message_id))


def test_a_backlog_larger_than_a_batch_is_handled_whole_and_once():
    # docs/guarantees.md: no message is skipped. A full batch moves the offset
    # to its last message, never to the fence: the rest of the backlog is below it.
    ids = publish_many(A, "claims.backlog", [{"n": n} for n in range(12)])
    consumer = SmallBatches()
    drain(consumer)  # until a round finds nothing more
    assert effects() == {str(i): 1 for i in ids}


# --- DESIGN/outbox.md: no relay holds a database transaction open across broker I/O ---------


class Inspecting(InMemoryTransport):
    """Records, during each send, whether the relay holds a transaction across it.

    Its own connections (the system alias's reads, the worker alias's lease),
    as psycopg sees them, must be idle; and no session of the system role, as
    the server sees it, may keep one transaction open from the start of the
    send to its end: by role, not by process id, so that it holds behind
    pgbouncer too, where a client's process id is pgbouncer's and its server
    session changes from one transaction to the next. (The relay's read-ahead
    may run its short read of the next batch during a send, on a connection
    of its own thread: a statement that starts and ends inside the send holds
    nothing across it.) The send lasts ``HOLD`` seconds, far longer than that
    read.
    """

    HOLD = 0.3
    SESSIONS = ("SELECT pid, xact_start FROM pg_stat_activity WHERE usename = %s"
                " AND xact_start IS NOT NULL")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple] = []

    def send(self, messages) -> None:
        local = {
            alias: connections[alias].connection.info.transaction_status
            for alias in (system_alias(), worker_alias())
            if connections[alias].connection is not None
        }
        role = [django_settings.DATABASES[system_alias()]["USER"]]
        with observer() as watcher:
            before = set(watcher.execute(self.SESSIONS, role).fetchall())
            time.sleep(self.HOLD)
            super().send(messages)
            after = set(watcher.execute(self.SESSIONS, role).fetchall())
        self.seen.append((local, before & after))


def test_no_transaction_is_open_on_the_relays_session_while_it_sends():
    publish_many(A, "t", [{"n": n} for n in range(5)])
    transport = Inspecting()
    relay = Relay(transport, name="claims", batch_size=2)
    try:
        relay.drain()
    finally:
        relay.release()
    assert len(transport.sent) == 5 and len(transport.seen) == 3
    # A connection of the relay's thread is idle, or closed between rounds (a batch read
    # ahead needs none of it); the first send follows a read on it.
    assert transport.seen[0][0], transport.seen
    for local, held_across in transport.seen:
        assert set(local.values()) <= {psycopg.pq.TransactionStatus.IDLE}, transport.seen
        assert held_across == set()


# --- docs/operations.md: SIGTERM stops a loop after the current batch ---------------------------


def test_sigterm_with_a_batch_in_flight_finishes_that_batch_and_loses_nothing(tmp_path):
    ids = publish_many(A, "order.sequenced", [{"seq": n} for n in range(8)],
                       key=lambda p: "one-key")  # one partition: one batch of 8
    proc = Process.manage(
        "run_consumers", "orders-partitioned", log=tmp_path / "consumer.log",
        env={**SUBPROCESS_SETTINGS, "DIO_HANDLER_DELAY": "0.25"},
    )
    try:
        # The batch is in flight: the consumer's worker-role session has a transaction open.
        def in_flight() -> bool:
            with observer() as conn:
                return conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND usename = %s AND xact_start IS NOT NULL AND pid <> pg_backend_pid()",
                    [django_settings.DATABASES[worker_alias()]["USER"]],
                ).fetchone()[0] > 0

        wait_for(in_flight, "the consumer's batch to start")
        assert count_rows("testapp_order") == 0  # nothing committed yet
        proc.signal(signal.SIGTERM)
        code = proc.popen.wait(60)
    finally:
        proc.kill()
    assert code == 0, proc.output[-3000:]
    assert effects() == {str(i): 1 for i in ids}, "the batch in flight was not finished"
    with observer() as conn:
        passed = conn.execute(
            "SELECT max(last_id) FROM consumer_offsets WHERE name = 'orders-partitioned'"
        ).fetchone()[0]
        last = conn.execute("SELECT max(id) FROM outbox_messages").fetchone()[0]
    assert passed >= last


# --- docs/outbox.md: receivers de-duplicate by message id, concurrent duplicates too ----------


def test_two_concurrent_deliveries_of_one_message_run_the_receiver_once():
    envelope = {
        "id": 1, "message_id": str(uuid.uuid4()), "tenant_id": A, "topic": "order.placed",
        "payload": {"sku": "tea"}, "key": None, "aggregate_type": None, "aggregate_id": None,
        "headers": {}, "created_at": None,
    }
    ran: list[str] = []
    results: dict[str, tuple] = {}
    errors: list[BaseException] = []

    def waiting_for_the_duplicate_to_block() -> bool:
        with observer() as conn:
            return conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            ).fetchone()[0] > 0

    def handler(message: Message) -> str:
        ran.append(threading.current_thread().name)
        Order.objects.create(tenant_id=current_tenant_id(), sku="tea",
                             note=str(message.message_id))
        if threading.current_thread().name == "first":
            # Hold the transaction open until the second delivery is under way.
            wait_for(waiting_for_the_duplicate_to_block, "the second delivery to block")
        return "done"

    def deliver(name: str) -> None:
        try:
            results[name] = receive(envelope, handler, receiver="claims.concurrent")
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    first = threading.Thread(target=deliver, args=("first",), name="first")
    first.start()
    wait_for(lambda: ran == ["first"], "the first delivery's handler")
    second = threading.Thread(target=deliver, args=("second",), name="second")
    second.start()
    first.join(120)
    second.join(120)
    assert not errors, errors
    assert ran == ["first"]
    assert results == {"first": (True, "done"), "second": (False, None)}
    assert count_rows("testapp_order") == 1


# --- the commands and tasks report what they did ---------------------------------------------


def test_relay_outbox_once_reports_the_messages_it_sent(settings, capsys):
    settings.OUTBOX = {**settings.OUTBOX, "TRANSPORT": "outbox.transports.LoggingTransport"}
    publish_many(A, "t", [{"n": n} for n in range(3)])
    call_command("relay_outbox", "--once")
    assert ": 3 message(s) sent" in capsys.readouterr().out
    call_command("relay_outbox", "--once")
    assert ": 0 message(s) sent" in capsys.readouterr().out


def test_the_reap_task_reports_what_it_deleted(settings):
    settings.OUTBOX = {**settings.OUTBOX, "CONSUMERS": [], "RETENTION": 0}
    publish_many(A, "t", [{"n": n} for n in range(3)])
    relay = Relay(InMemoryTransport())  # the one reader: it passes all three
    try:
        assert relay.drain() == 3
    finally:
        relay.release()
    receive(
        {"id": 1, "message_id": str(uuid.uuid4()), "tenant_id": A, "topic": "t", "payload": {}},
        lambda m: None, receiver="claims.reap",
    )
    with observer() as conn:  # older than the (zero) retention windows, by the database clock
        conn.execute("UPDATE outbox_messages SET created_at = now() - interval '1 minute'")
        conn.execute("UPDATE outbox_received SET received_at = now() - interval '1 minute'")
    assert tasks.reap() == {"messages": 3, "received": 1}
    assert count_rows("outbox_messages") == 0 and count_rows("outbox_received") == 0
    assert tasks.reap() == {"messages": 0, "received": 0}


# --- docs/scaling.md: leases, retry pauses and retention by the database clock (the keys'
# half: tests/idempotency/test_claims.py) -------------------------------------------------


def _seconds(sql: str, *params: object) -> float:
    with observer() as conn:
        return conn.execute(f"SELECT extract(epoch FROM {sql})::float", params).fetchone()[0]


def test_every_lease_pause_and_retention_of_the_outbox_is_the_database_clocks(
        settings, monkeypatch, wrong_app_clock):
    import datetime as dt

    from django.db.models.functions import Now

    from outbox.exceptions import RewindRefused
    from outbox.relay import rewind
    from outbox.retention import reap
    from tenancy import tenant_context
    from tests.outbox.factories import ReceivedMessageFactory
    from tests.outbox.support.helpers import recorder
    from tests.outbox.support.recorders import FAILING, OrderRecorder

    settings.OUTBOX = {**settings.OUTBOX, "CONSUMERS": [recorder("OrderRecorder")],
                       "TRANSPORT": None, "RELAY_LEASE": 30, "RETENTION": 3600}
    monkeypatch.setattr(OrderRecorder, "retry_backoff", 100)
    # The relay's lease.
    publish_many(A, "order.placed", [{"sku": "a"}])
    relay = Relay(InMemoryTransport(), name="clock")
    wait_for(lambda: relay.drain() >= 0 and relay.sent == 1, "relayed")
    assert 20 < _seconds("(SELECT lease_until FROM consumer_offsets WHERE name = %s) - now()",
                         "relay:clock") <= 30
    relay.release()
    with observer() as conn:  # no longer a reader: retention below waits for the consumer only
        conn.execute("DELETE FROM consumer_offsets WHERE name = 'relay:clock'")

    # A consumer's retry pause.
    FAILING.add("b")
    publish_many(A, "order.placed", [{"sku": "b"}])
    drain(OrderRecorder(), until=lambda: count_rows("consumer_offsets",
                                                    "name = 'orders' AND attempts = 1") == 1)
    assert 90 < _seconds("(SELECT retry_at FROM consumer_offsets WHERE name = 'orders')"
                         " - now()") <= 100
    FAILING.discard("b")
    with observer() as conn:
        conn.execute("UPDATE consumer_offsets SET retry_at = now() WHERE name = 'orders'")
    drain(OrderRecorder(), until=lambda: len(effects()) == 2)

    # Retention: a message a minute old stays, one two hours old goes; receiver records too.
    with observer() as conn:
        conn.execute("UPDATE outbox_messages SET created_at = now() - interval '2 hours'"
                     " WHERE payload->>'sku' = 'a'")
        conn.execute("UPDATE outbox_messages SET created_at = now() - interval '1 minute'"
                     " WHERE payload->>'sku' = 'b'")
        db_now = conn.execute("SELECT now()").fetchone()[0]
    with tenant_context(A):
        ReceivedMessageFactory(received_at=Now() - dt.timedelta(hours=2))
        ReceivedMessageFactory(received_at=Now() - dt.timedelta(minutes=1))
    result = reap()
    assert (result.messages, result.received) == (1, 1)

    # Rewinding: refused past RETENTION by the database's now().
    assert rewind(db_now - dt.timedelta(minutes=30), dry_run=True) is not None
    with pytest.raises(RewindRefused, match="older than what the outbox keeps"):
        rewind(db_now - dt.timedelta(hours=2), dry_run=True)
