"""The publisher fence: only a transaction that has published and is still open
holds delivery back, and no message is skipped however late it commits.

Every row of ``outbox_messages`` takes its id from ``outbox_next_id()``, which
first takes a transaction-level shared advisory lock naming a lower bound of
the transaction's ids; readers read below ``outbox_fence()`` (the last id
handed out, or the lowest bound still locked, plus one) in a snapshot taken
after it. docs/guarantees.md has the argument; these tests hold it to account.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
import pytest
from django.db import connections, transaction

from outbox import publish
from outbox.models import OutboxMessage
from outbox.relay import Relay
from outbox.status import status
from outbox.store import read_batch
from outbox.testing import InMemoryTransport
from tenancy import tenant_context
from tenancy.aliases import app_alias, system_alias
from tests.helpers import connect, observer, server_pid, set_tenant, superuser
from tests.outbox.consumers import OrderRecorder
from tests.outbox.helpers import (
    drain,
    effects,
    message_position,
    publish_as,
    raw_publish,
    wait_for,
)

A, B = 1, 2


def relay_until(relay: Relay, memory: InMemoryTransport, count: int) -> None:
    """Drain until ``count`` messages were sent, in a thread of its own.

    The relay's loop drops this thread's old connections before each step
    (``close_old_connections``), which would end the test's own open
    transaction on the default alias; in its own thread it has its own.
    """
    in_thread(lambda: wait_for(lambda: relay.drain() >= 0 and len(memory.sent) >= count,
                               f"{count} relayed"))


def drain_relay(relay: Relay) -> None:
    """One drain, in a thread of its own (see :func:`relay_until`)."""
    in_thread(relay.drain)


def published_elsewhere(tenant_id: int, sku: str) -> str:
    """A message published and committed by another session; its message id."""
    with connect() as conn, conn.transaction():
        _, message_id = raw_publish(conn, tenant_id, "order.placed", {"sku": sku})
    return str(message_id)


def in_thread(work: Callable[[], Any]) -> Any:
    """Run ``work`` in a thread of its own (its own Django connections), and return its result."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]


@contextmanager
def unrelated_transaction(database: str | None = None) -> Iterator[psycopg.Connection]:
    """A transaction that wrote something (so it has a transaction id) and stays open.

    On the test database, or on another database of the same server (the
    old fence counted every transaction on the server).
    """
    with superuser(database) as conn:
        conn.execute("BEGIN")
        conn.execute("CREATE TEMP TABLE unrelated_work (n int)")
        conn.execute("INSERT INTO unrelated_work VALUES (1)")
        yield conn
        conn.execute("ROLLBACK")


def still_open_with_an_xid(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT pg_current_xact_id_if_assigned() IS NOT NULL").fetchone()[0]


@pytest.mark.parametrize("database", [None, "postgres"], ids=["same database", "another database"])
def test_an_unrelated_transaction_that_wrote_does_not_delay_delivery(database):
    with unrelated_transaction(database) as other:
        first = publish_as(A, "order.placed", {"sku": "a"})
        second = publish_as(B, "order.placed", {"sku": "b"})
        memory = InMemoryTransport()
        relay_until(Relay(memory, name="test"), memory, 2)
        drain(OrderRecorder(), until=lambda: len(effects()) == 2)
        assert still_open_with_an_xid(other)  # delivered while it is open, and before it ends
        assert status().blocker is None and status().held_back == 0
    assert memory.message_ids == [str(first), str(second)]
    assert effects() == {str(first): 1, str(second): 1}


def test_a_publishing_transaction_left_open_delays_only_messages_with_larger_ids():
    memory = InMemoryTransport()
    relay = Relay(memory, name="test")
    before = publish_as(A, "order.placed", {"sku": "before"})  # this session published before
    with tenant_context(A):  # ...and now publishes again and stays open
        held = publish("order.placed", {"sku": "held"})
        after = published_elsewhere(B, "after")
        relay_until(relay, memory, 1)
        drain_relay(relay)
        assert memory.message_ids == [str(before)]  # the earlier message is delivered
        in_thread(lambda: drain(OrderRecorder(), until=lambda: len(effects()) == 1))
        assert effects() == {str(before): 1}
        s = in_thread(status)
        own_id = OutboxMessage.objects.get(message_id=held).id  # seen by its own transaction
        assert s.blocker is not None and s.blocker.bound < own_id
        assert s.held_back == 1  # "after"; "held" itself is not committed yet
    relay_until(relay, memory, 3)
    assert memory.message_ids == [str(before), str(held), after]  # in id order, once each
    drain(OrderRecorder(), until=lambda: len(effects()) == 3)
    assert effects() == {str(before): 1, str(held): 1, after: 1}


def roll_back_a_publish(savepoints: str) -> None:
    """Publish in a savepoint, then roll the savepoint back (the message goes with it)."""
    if savepoints == "atomic":
        with suppress(RuntimeError), transaction.atomic(using=app_alias()):
            publish("order.placed", {"sku": "dropped"})
            raise RuntimeError
    else:  # Django keeps the on-commit hooks registered after a manual savepoint
        sid = transaction.savepoint(using=app_alias())
        publish("order.placed", {"sku": "dropped"})
        transaction.savepoint_rollback(sid, using=app_alias())


@pytest.mark.parametrize("savepoints", ["atomic", "manual"])
@pytest.mark.parametrize("first_publish", ["in the savepoint", "before the savepoint"])
def test_a_publish_after_a_rolled_back_savepoint_still_holds_the_fence(savepoints,
                                                                       first_publish):
    memory = InMemoryTransport()
    relay = Relay(memory, name="test")
    kept = []
    with tenant_context(A):
        if first_publish == "before the savepoint":
            kept.append(publish("order.placed", {"sku": "first"}))
        roll_back_a_publish(savepoints)
        kept.append(publish("order.placed", {"sku": "kept"}))
        later = published_elsewhere(B, "later")  # a larger id, committed first
        drain_relay(relay)
        assert memory.sent == []  # "later" waits for this transaction
    relay_until(relay, memory, len(kept) + 1)
    assert memory.message_ids == [*map(str, kept), later]
    assert [m.payload["sku"] for m in memory.sent if m.payload["sku"] == "dropped"] == []


def test_out_of_order_commits_of_many_sessions_are_each_delivered_once_in_id_order():
    """Publishers commit in the reverse order of their ids while a relay keeps reading."""
    memory = InMemoryTransport()
    relay = Relay(memory, name="test")
    sessions = [connect() for _ in range(4)]
    try:
        ids = []
        for conn in sessions:
            conn.execute("BEGIN")
            ids.append(str(raw_publish(conn, A, "order.placed", {"sku": "x"})[1]))
        for conn in reversed(sessions):
            relay.drain()
            conn.execute("COMMIT")
        relay_until(relay, memory, len(ids))
        relay.drain()
    finally:
        for conn in sessions:
            conn.close()
    assert memory.message_ids == ids


def waiting_for_the_sequence(mode: str) -> bool:
    """Whether a session waits for a lock of ``mode`` on outbox_message_ids."""
    with observer() as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND mode = %s"
            " AND relation = 'outbox_message_ids'::regclass", [mode]
        ).fetchone()[0] > 0


def test_a_publisher_that_commits_while_a_reader_takes_the_fence_is_not_skipped():
    """The rows are read in a snapshot taken after the fence, not in the statement's own.

    The reader's statement starts (a single SELECT would take its snapshot
    there), then waits for the sequence while the publisher commits and
    releases its lock: the fence then lets the publisher's id through, so the
    rows must be read in a snapshot that sees its commit. The wait is made
    with PostgreSQL's lock queue: an exclusive request on the sequence, queued
    behind the publisher's own lock on it, holds the reader's request back
    until the test lets it go.
    """
    owner = connections["owner"].settings_dict["USER"]
    granted, release = threading.Event(), threading.Event()

    def block_the_sequence() -> None:
        with observer() as conn:
            conn.execute("BEGIN")
            conn.execute(f"ALTER SEQUENCE outbox_message_ids OWNER TO {owner}")  # no change
            granted.set()
            release.wait(60)
            conn.execute("ROLLBACK")

    batches: list[Any] = []

    def read() -> None:
        try:
            batches.append(read_batch(system_alias(), 0, 10))
        finally:
            connections.close_all()

    with connect() as publisher:
        publisher.execute("BEGIN")
        _, message_id = raw_publish(publisher, A, "order.placed", {"sku": "late"})
        blocker = threading.Thread(target=block_the_sequence)
        blocker.start()
        reader = threading.Thread(target=read)
        try:
            wait_for(lambda: waiting_for_the_sequence("AccessExclusiveLock"), "the blocker")
            reader.start()
            wait_for(lambda: waiting_for_the_sequence("AccessShareLock"), "the reader to wait")
            publisher.execute("COMMIT")  # its lock goes; the blocker gets the sequence
            assert granted.wait(60)
        finally:
            release.set()
            blocker.join()
            if reader.is_alive() or reader.ident:
                reader.join()
    [batch] = batches
    assert [m.message_id for m in batch.messages] == [message_id]
    assert batch.fence > message_position(message_id)


def test_ids_come_from_a_sequence_that_hands_out_increasing_values_across_sessions():
    with observer() as conn:
        cache, cycle, increment = conn.execute(
            "SELECT seqcache, seqcycle, seqincrement FROM pg_sequence"
            " WHERE seqrelid = 'outbox_message_ids'::regclass"
        ).fetchone()
        default = conn.execute(
            "SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef WHERE adrelid ="
            " 'outbox_messages'::regclass AND adnum = (SELECT attnum FROM pg_attribute"
            " WHERE attrelid = 'outbox_messages'::regclass AND attname = 'id')"
        ).fetchone()[0]
    assert (cache, cycle, increment) == (1, False, 1)
    assert default == "outbox_next_id()"
    first, second = connect(), connect()
    try:
        seen = []
        for conn in (first, second, first, second):  # interleaved sessions
            with conn.transaction():
                seen.append(raw_publish(conn, A, "t", {})[0])
    finally:
        first.close()
        second.close()
    assert seen == sorted(seen) and len(set(seen)) == 4


def publisher_locks() -> list[tuple[int | None, int]]:
    """(pid, bound) of every publisher mark in pg_locks, as outbox_fence() reads them."""
    with observer() as conn:
        return conn.execute(
            "SELECT pid, ((classid::bigint & 65535) << 32) | objid::bigint FROM pg_locks"
            " WHERE locktype = 'advisory' AND objsubid = 2 AND granted"
            " AND classid::bigint >> 16 = 28514 AND database ="
            " (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()


def test_a_publisher_holds_one_lock_naming_a_bound_below_its_ids_until_it_ends():
    publish_as(A, "t", {})  # ids 1..: the bound of the next publisher is at least 1
    with connect() as conn:
        conn.execute("BEGIN")
        first = raw_publish(conn, A, "t", {})[0]
        second = raw_publish(conn, A, "t", {})[0]
        [(pid, bound)] = publisher_locks()
        assert pid == server_pid(conn)
        assert bound < first < second
        assert connect_fence() == bound + 1
        conn.execute("COMMIT")
    assert publisher_locks() == []
    assert connect_fence() == second + 1


def connect_fence() -> int:
    with connect("system") as conn:
        return conn.execute("SELECT outbox_fence()").fetchone()[0]


def test_a_foreign_lock_with_the_tag_can_only_lower_the_fence():
    """Someone else's advisory lock that looks like a publisher's holds the fence lower, no more."""
    last = message_position(publish_as(A, "t", {}))
    with observer() as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock((28514 << 16), 0)")  # "bound 0", exclusive
        assert connect_fence() == 1
        conn.execute("ROLLBACK")
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock_shared((28514 << 16) | 65535, -1)")  # 2^48-1
        assert connect_fence() == last + 1  # the last id handed out still bounds it
        conn.execute("ROLLBACK")


def test_the_reader_refuses_a_snapshot_isolation_that_would_reuse_its_snapshot():
    with connect("system") as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.RaiseException, match="READ COMMITTED"):
            conn.execute("SELECT * FROM outbox_read(0, 10, NULL, 0, 1)")


@pytest.fixture(scope="module")
def prepared_transactions():
    """Two-phase commit on the private cluster: max_prepared_transactions > 0.

    scripts/services starts PostgreSQL with 8; a cluster started by an older
    checkout has 0 until it is restarted.
    """
    with observer() as conn:
        allowed = int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])
    assert allowed > 0, ("max_prepared_transactions is 0: restart the private cluster "
                         "(scripts/services stop, then run the tests again)")


def test_a_prepared_transaction_that_published_holds_later_messages_until_it_commits(
    prepared_transactions, capsys
):
    import uuid

    from django.core.management import call_command

    memory = InMemoryTransport()
    relay = Relay(memory, name="test")
    before = str(publish_as(A, "order.placed", {"sku": "before"}))
    gid = f"dio-test-{uuid.uuid4().hex[:8]}"
    with connect(autocommit=True) as conn:
        conn.execute("BEGIN")
        _, held = raw_publish(conn, A, "order.placed", {"sku": "held"})
        conn.execute(f"PREPARE TRANSACTION '{gid}'")  # its session ends; its lock stays
    try:
        after = published_elsewhere(B, "after")
        relay_until(relay, memory, 1)
        drain_relay(relay)
        assert memory.message_ids == [before]
        blocker = status().blocker
        assert blocker is not None
        assert (blocker.pid, blocker.state, blocker.query) == (None, "prepared", gid)
        call_command("outbox_status")
        assert f"prepared transaction '{gid}'" in capsys.readouterr().out
        with observer() as conn:
            conn.execute(f"COMMIT PREPARED '{gid}'")
    finally:
        with observer() as conn:
            if conn.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", [gid]).fetchone():
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
    relay_until(relay, memory, 3)
    assert memory.message_ids == [before, str(held), after]


class PublishesNothing(OrderRecorder):
    """Records each message (so its batch has an xid), and meanwhile checks that a
    message published elsewhere is relayed while the batch is still open."""

    name = "publishes-nothing"
    relayed_during_batch: list[str] = []

    def handle(self, message: Any) -> None:
        super().handle(message)
        if message.payload.get("sku") != "first":
            return
        newer = published_elsewhere(B, "newer")
        memory = InMemoryTransport()
        relay_until(Relay(memory, name="test"), memory, 2)
        PublishesNothing.relayed_during_batch = memory.message_ids
        assert memory.message_ids[-1] == newer


def test_a_consumer_batch_in_flight_holds_nothing_back():
    from outbox.consumers import ensure_offsets, run_batch

    first = publish_as(A, "order.placed", {"sku": "first"})
    consumer = PublishesNothing()
    ensure_offsets(consumer)
    wait_for(lambda: run_batch(consumer).handled >= 1, "the batch")
    relayed = PublishesNothing.relayed_during_batch
    assert relayed[0] == str(first) and len(relayed) == 2  # "newer" too, during the batch


def test_a_role_with_insert_only_can_publish_no_grant_on_the_sequence():
    """The id default runs as the tables' owner; a publisher needs INSERT, nothing more."""
    with observer() as conn:
        conn.execute("DROP ROLE IF EXISTS dio_test_insert_only")
        conn.execute("CREATE ROLE dio_test_insert_only NOSUPERUSER NOBYPASSRLS")
        conn.execute("GRANT INSERT ON outbox_messages TO dio_test_insert_only")
        try:
            conn.execute("BEGIN")
            conn.execute("SET LOCAL ROLE dio_test_insert_only")
            set_tenant(conn, 1)
            assert not conn.execute(
                "SELECT has_sequence_privilege('outbox_message_ids', 'USAGE')"
                " OR has_sequence_privilege('outbox_message_ids', 'SELECT')").fetchone()[0]
            conn.execute("INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
                         " VALUES (1, gen_random_uuid(), 't', '{}')")
            assert [pid for pid, _ in publisher_locks()] == [server_pid(conn)]
            conn.execute("COMMIT")
        finally:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
            conn.execute("REVOKE ALL ON outbox_messages FROM dio_test_insert_only")
            conn.execute("DROP ROLE dio_test_insert_only")
    memory = InMemoryTransport()
    relay_until(Relay(memory, name="test"), memory, 1)


def test_a_forged_bound_cannot_move_the_fence_past_an_open_publisher():
    """``outbox.publisher_bound`` is an ordinary setting that any role may set:
    a larger value written by hand before publishing must not become the
    publisher's bound (the fence would then pass its uncommitted row)."""
    published_elsewhere(A, "before")
    with connect() as forger, observer() as reader:
        forger.execute("BEGIN")
        forger.execute("SELECT set_config('outbox.publisher_bound', '281474976710000', true)")
        row_id, _ = raw_publish(forger, A, "order.placed", {"sku": "forged"})
        published_elsewhere(A, "after")
        fence = reader.execute("SELECT outbox_fence()").fetchone()[0]
        assert fence <= row_id, "the fence passed a row whose transaction is still open"
        forger.execute("ROLLBACK")
