"""The fence per tenant: only a transaction that has published and is still open
holds delivery back, and only its own tenants' later messages; no message is
skipped however late it commits.

Every row of ``outbox_messages`` takes its id from the trigger
``outbox_mark_publisher_v2()``, which first marks its transaction with
transaction-level shared advisory locks naming the row's tenant and a bound
below the transaction's ids; readers (``outbox_read_v2()``) read the last id
handed out, then the publishers in flight (marks whose transaction holds the
outbox's write lock), then the rows in a snapshot taken after both, each
tenant in flight only up to its bound. docs/guarantees.md has the argument;
these tests hold it to account.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connections, transaction

from outbox import publish
from outbox.models import OutboxMessage
from outbox.observation import status
from outbox.relay import Relay
from outbox.store import read_batch
from outbox.stream import Position
from outbox.testing import InMemoryTransport
from tenancy import tenant_context
from tenancy.aliases import app_alias, system_alias, worker_alias
from tests.helpers import connect, observer, server_pid, set_tenant, superuser
from tests.outbox.support.helpers import (
    drain,
    effects,
    message_position,
    publish_as,
    raw_publish,
    wait_for,
)
from tests.outbox.support.recorders import OrderRecorder

# make test-variants runs the tests marked `variants` again: those that send a statement
# through the library's aliases, which a deployment variant can change (docs/contributing.md).

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


# In the variants, the same database only: the cases differ in the database a session of the
# test's own writes in; the library's statements, all that a variant changes, are the same.
@pytest.mark.parametrize("database", [
    pytest.param(None, id="same database", marks=pytest.mark.variants),
    pytest.param("postgres", id="another database"),
])
def test_an_unrelated_transaction_that_wrote_does_not_delay_delivery(database):
    with unrelated_transaction(database) as other:
        first = publish_as(A, "order.placed", {"sku": "a"})
        second = publish_as(B, "order.placed", {"sku": "b"})
        memory = InMemoryTransport()
        relay_until(Relay(memory, name="test"), memory, 2)
        drain(OrderRecorder(), until=lambda: len(effects()) == 2)
        assert still_open_with_an_xid(other)  # delivered while it is open, and before it ends
        assert status().publishers == [] and status().held_back == 0
    assert memory.message_ids == [str(first), str(second)]
    assert effects() == {str(first): 1, str(second): 1}


@pytest.mark.variants
def test_a_publishing_transaction_left_open_delays_only_its_own_tenants_later_messages():
    memory = InMemoryTransport()
    relay = Relay(memory, name="test")
    before = publish_as(A, "order.placed", {"sku": "before"})  # this session published before
    with tenant_context(A):  # ...and now publishes again and stays open
        held = publish("order.placed", {"sku": "held"})
        other_tenant = published_elsewhere(B, "other tenant")  # a larger id, committed first
        same_tenant = published_elsewhere(A, "same tenant")  # as well, but of tenant A
        relay_until(relay, memory, 2)
        drain_relay(relay)
        # the earlier message, and the other tenant's later one, are delivered
        assert memory.message_ids == [str(before), other_tenant]
        in_thread(lambda: drain(OrderRecorder(), until=lambda: len(effects()) == 2))
        assert effects() == {str(before): 1, other_tenant: 1}
        s = in_thread(status)
        own_id = OutboxMessage.objects.get(message_id=held).id  # seen by its own transaction
        [publisher] = s.publishers
        assert publisher.tenants == (A,) and publisher.bound < own_id
        assert s.held_back == 1  # "same tenant"; "held" itself is not committed yet
        relay_state = next(r for r in s.readers if r.name == "relay:test")
        assert set(relay_state.position.held) == {A}
    relay_until(relay, memory, 4)
    # tenant A's in id order, each message once
    assert memory.message_ids == [str(before), other_tenant, str(held), same_tenant]
    drain(OrderRecorder(), until=lambda: len(effects()) == 4)
    assert effects() == {str(before): 1, str(held): 1, other_tenant: 1, same_tenant: 1}
    states = {r.name: r for r in status().readers}
    assert states["relay:test"].position.held == {} and states["orders"].position.held == {}


@pytest.mark.variants
def test_an_open_publisher_of_one_tenant_holds_back_none_of_many_others():
    """The multi-tenant promise: 20 other tenants' events flow while one tenant's stays open."""
    memory = InMemoryTransport()
    relay = Relay(memory, name="test")
    with connect() as slow:
        slow.execute("BEGIN")
        raw_publish(slow, A, "order.placed", {"sku": "slow"})
        others = [published_elsewhere(tenant, f"t{tenant}") for tenant in range(10, 30)]
        relay_until(relay, memory, 20)
        drain(OrderRecorder(), until=lambda: len(effects()) == 20)
        assert sorted(memory.message_ids) == sorted(others)
        assert set(effects()) == set(others)
        slow.execute("COMMIT")
    relay_until(relay, memory, 21)
    drain(OrderRecorder(), until=lambda: len(effects()) == 21)
    assert len(set(memory.message_ids)) == 21 and sum(effects().values()) == 21


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


@pytest.mark.variants
@pytest.mark.parametrize("savepoints", ["atomic", "manual"])
@pytest.mark.parametrize("first_publish", ["in the savepoint", "before the savepoint"])
def test_a_publish_after_a_rolled_back_savepoint_still_holds_its_tenant_back(savepoints,
                                                                              first_publish):
    memory = InMemoryTransport()
    relay = Relay(memory, name="test")
    kept = []
    with tenant_context(A):
        if first_publish == "before the savepoint":
            kept.append(publish("order.placed", {"sku": "first"}))
        roll_back_a_publish(savepoints)
        kept.append(publish("order.placed", {"sku": "kept"}))
        later = published_elsewhere(A, "later")  # a larger id of the same tenant, committed first
        elsewhere = published_elsewhere(B, "elsewhere")  # another tenant's: not held back
        relay_until(relay, memory, 1)
        drain_relay(relay)
        assert memory.message_ids == [elsewhere]  # "later" waits for this transaction
    relay_until(relay, memory, len(kept) + 2)
    assert memory.message_ids == [elsewhere, *map(str, kept), later]
    assert [m.payload["sku"] for m in memory.sent if m.payload["sku"] == "dropped"] == []


@pytest.mark.variants
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


@pytest.mark.variants
def test_a_publisher_that_commits_while_a_reader_takes_the_fence_is_not_skipped():
    """The rows are read in a snapshot taken after the fence, not in the statement's own.

    The reader's statement starts (a single SELECT would take its snapshot
    there), then waits for the sequence while the publisher commits and
    releases its marks: the read then sees no publisher in flight and lets
    the publisher's id through, so the rows must be read in a snapshot that
    sees its commit. The wait is made
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
            batches.append(read_batch(system_alias(), Position(), 10))
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
    assert batch.allocated >= message_position(message_id) and batch.in_flight == {}


def test_ids_come_from_a_sequence_that_hands_out_increasing_values_across_sessions():
    with observer() as conn:
        cache, cycle, increment = conn.execute(
            "SELECT seqcache, seqcycle, seqincrement FROM pg_sequence"
            " WHERE seqrelid = 'outbox_message_ids'::regclass"
        ).fetchone()
        trigger = conn.execute(
            "SELECT tgfoid::regprocedure::text, tgenabled FROM pg_trigger"
            " WHERE tgrelid = 'outbox_messages'::regclass AND NOT tgisinternal"
        ).fetchall()
    assert (cache, cycle, increment) == (1, False, 1)
    assert trigger == [("outbox_mark_publisher_v2()", "O")]
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


def marks() -> list[tuple[int | None, int, int]]:
    """(pid, tenant, bound) of every publisher in flight, as the readers see them."""
    with observer() as conn:
        return sorted(conn.execute(
            "SELECT pid, tenant_id, bound FROM outbox_publishers_v2()").fetchall())


def readable(position: Position | None = None, limit: int = 100) -> list[uuid.UUID]:
    """The message ids a reader at ``position`` (the start) may pass now, in order."""
    at = position or Position()
    return [m.message_id for m in in_thread(lambda: read_batch(system_alias(), at,
                                                               limit).messages)]


@pytest.mark.variants
def test_a_publisher_marks_its_tenants_and_a_bound_below_its_ids_until_it_ends():
    publish_as(A, "t", {})  # ids 1..: the bound of the next publisher is at least 1
    with connect() as conn:
        conn.execute("BEGIN")
        first = raw_publish(conn, A, "t", {})[0]
        second = raw_publish(conn, B, "t", {})[0]  # the same transaction, another tenant
        [(pid, tenant_a, bound_a), (_, tenant_b, bound_b)] = marks()
        assert pid == server_pid(conn)
        assert (tenant_a, tenant_b) == (A, B)
        assert bound_a == bound_b < first < second
        conn.execute("COMMIT")
    assert marks() == []


@pytest.mark.variants
def test_an_insert_that_names_its_own_id_is_refused():
    """An id below the readers' positions would never be delivered: the database gives ids."""
    last = message_position(publish_as(A, "t", {}))
    for alias in ("default", "worker"):
        with connect(alias) as conn, conn.transaction():
            set_tenant(conn, A)
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="given by the database"):
                conn.execute("INSERT INTO outbox_messages (tenant_id, id, message_id, topic,"
                             " payload) VALUES (%s, %s, gen_random_uuid(), 't', '{}')",
                             [A, last - 1])


def test_a_messages_time_and_transaction_are_the_databases_whatever_the_insert_says():
    """Issue 29, item 3: the web role gave a message any created_at (and xid); the trigger
    writes the transaction's start and id instead."""
    for alias in ("default", "worker"):
        with connect(alias) as conn, conn.transaction():
            set_tenant(conn, A)
            written = conn.execute(
                "INSERT INTO outbox_messages (tenant_id, message_id, topic, payload, created_at,"
                " xid) VALUES (%s, gen_random_uuid(), 't', '{}', '2999-01-01', '1')"
                " RETURNING created_at = now(), xid = pg_current_xact_id()", [A]).fetchone()
            assert written == (True, True)


def direct(alias: str = "default", **kwargs: Any) -> psycopg.Connection:
    """A session of the role of ``alias`` straight to PostgreSQL, even when the alias is
    pooled: what it leaves ends with it (a pooled one would stay for later tests)."""
    db, server = settings.DATABASES[alias], settings.DATABASES["owner"]
    return psycopg.connect(host=server["HOST"], port=server["PORT"], user=db["USER"],
                           password=db["PASSWORD"], dbname=db["NAME"], **kwargs)


STRAY_LOCKS = {
    "bound, shared": ["SELECT pg_advisory_lock_shared((28514 << 16), 0)"],
    "bound, exclusive": ["SELECT pg_advisory_lock((28514 << 16), 0)"],
    "tenant": [f"SELECT pg_advisory_lock_shared({A})"],
    "all three": ["SELECT pg_advisory_lock_shared((28514 << 16), 0)",
                  f"SELECT pg_advisory_lock_shared({A})", f"SELECT pg_advisory_lock({B})"],
}


# In the variants, "all three" only: the forms differ in the locks a session of the test's own
# holds; the library's statements, all that a variant changes, are the same for each.
@pytest.mark.parametrize("form", [
    pytest.param(form, marks=pytest.mark.variants) if form == "all three" else form
    for form in STRAY_LOCKS
])
def test_a_session_lock_left_behind_holds_nothing_back(form):
    """Advisory locks that look like a publisher's marks, kept by a session after its
    transaction, hold nothing back: marks count only in a transaction writing to the
    outbox."""
    for alias in (app_alias(), worker_alias()):  # the web role, the worker role
        with direct(alias, autocommit=True) as stray:
            for statement in STRAY_LOCKS[form]:
                stray.execute(statement)
            first = published_elsewhere(A, "a")
            second = published_elsewhere(B, "b")
            assert marks() == []
            assert readable()[-2:] == [uuid.UUID(first), uuid.UUID(second)]
            assert status().publishers == [] and status().held_back == 0


# In the variants, "all three" only (as above: the forms differ in the locks left behind, not
# in the library's statements).
@pytest.mark.parametrize("form", [
    pytest.param(form, marks=pytest.mark.variants) if form == "all three" else form
    for form in STRAY_LOCKS
])
def test_a_session_lock_left_in_a_pooled_session_holds_nothing_back_for_the_next_borrower(form):
    """The same through pgbouncer in transaction mode, with one server session per pool:
    one borrower (as the web role) leaves the locks and hangs up; the next borrowers of
    that very session publish for two other tenants, and every message is delivered."""
    from tests.pooler import pool_of_one

    relay = Relay(InMemoryTransport(), name="test")
    with pool_of_one() as pooler:
        pooler.leave(app_alias(), *STRAY_LOCKS[form])
        with pooler.routed(app_alias()):
            first = publish_as(3, "order.placed", {"sku": "next borrower"})
            second = publish_as(4, "order.placed", {"sku": "and the next"})
        with pooler.connect(app_alias()) as same:  # the locks are still in that session
            pid = same.execute("SELECT pg_backend_pid()").fetchone()[0]
        with observer() as conn:
            assert conn.execute("SELECT count(*) FROM pg_locks WHERE pid = %s"
                                " AND locktype = 'advisory'", [pid]).fetchone()[0] == len(
                                    STRAY_LOCKS[form])
        assert marks() == []
        memory = relay.transport
        relay_until(relay, memory, 2)
        assert memory.message_ids == [str(first), str(second)]


@pytest.mark.variants
def test_a_session_lock_left_behind_holds_nothing_back_even_during_a_publishing_transaction():
    """Inside a transaction of that session that does publish (for tenant A), a stray mark
    naming tenant B still counts for nothing: B's mark has no proof that the trigger took it
    for B in that transaction."""
    with direct(autocommit=True) as conn:
        conn.execute(f"SELECT pg_advisory_lock_shared({B})")  # a stray mark naming tenant B
        conn.execute("BEGIN")
        raw_publish(conn, A, "t", {"sku": "publishing"})
        late = published_elsewhere(B, "b")
        assert [t for _, t, _ in marks()] == [A]
        assert uuid.UUID(late) in readable()
        conn.execute("COMMIT")


# In the variants, the tenant's only: the cases differ in which key a session of the test's
# own holds; the library's statements, all that a variant changes, are the same for both.
@pytest.mark.parametrize("key", [pytest.param("the tenant's", marks=pytest.mark.variants),
                                 "the bound's"])
def test_a_key_held_exclusively_by_someone_else_blocks_no_publisher_and_passes_nothing(key):
    """Advisory locks belong to no one: a session may hold a mark's key exclusively.
    Publishers do not wait for it (a blocked bound or tenant mark is replaced by one that
    holds back more), and readers still never pass an open publisher's message."""
    last = message_position(publish_as(A, "t", {}))
    statement = {"the tenant's": f"SELECT pg_advisory_lock({A})",
                 "the bound's": f"SELECT pg_advisory_lock((28514 << 16), {last})"}[key]
    with direct(autocommit=True) as stray, connect() as publisher:
        stray.execute(statement)
        publisher.execute("BEGIN")
        publisher.execute("SET LOCAL lock_timeout = '5s'")  # a publisher that waited fails
        own, own_id = raw_publish(publisher, A, "t", {"sku": "open"})
        later_a = published_elsewhere(A, "later a")
        later_b = published_elsewhere(B, "later b")
        seen = readable(Position(last))
        assert own_id not in seen and uuid.UUID(later_a) not in seen
        if key == "the tenant's":  # marked for any tenant: B waits too, while it is open
            assert seen == [] and [p.any_tenant for p in status().publishers] == [True]
        else:  # no bound: tenant A is held back whole, B is not
            assert seen == [uuid.UUID(later_b)]
            assert [(t, b) for _, t, b in marks()] == [(A, 0)]
        publisher.execute("COMMIT")
    assert readable(Position(last)) == [own_id, uuid.UUID(later_a), uuid.UUID(later_b)]


@pytest.mark.variants
def test_a_row_marks_its_own_tenant_whatever_the_sessions_setting_says():
    """A role RLS does not confine (the owner, a maintenance script) may write a tenant's row
    with another tenant, or none, set: the mark still names the row's tenant."""
    last = message_position(publish_as(A, "t", {}))
    with observer() as writer:
        writer.execute("BEGIN")
        writer.execute("SELECT set_config('app.tenant_id', %s, true)", [str(A)])
        writer.execute("INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
                       " VALUES (%s, gen_random_uuid(), 't', '{}')", [B])
        assert [(t, b < last + 1) for _, t, b in marks()] == [(B, True)]
        later_b = published_elsewhere(B, "later")
        assert uuid.UUID(later_b) not in readable(Position(last))
        writer.execute("COMMIT")
    assert uuid.UUID(later_b) in readable(Position(last))


def test_a_foreign_lock_in_a_publishing_transaction_can_only_hold_back_more():
    """Someone else's advisory lock that looks like a mark, taken inside a transaction that
    published, holds more back while that transaction is open; it never lets a message by."""
    with connect() as conn:
        conn.execute("BEGIN")
        own, _ = raw_publish(conn, A, "t", {})
        conn.execute("SELECT pg_advisory_xact_lock_shared((28514 << 16) | 65535, -1)")  # 2^48-1
        [(_, tenant, bound)] = marks()
        assert tenant == A and bound < own  # the lowest bound wins
        conn.execute("SELECT pg_advisory_xact_lock_shared((28514 << 16), 0)")  # "bound 0"
        assert [(t, b) for _, t, b in marks()] == [(A, 0)]
        conn.execute("ROLLBACK")
    assert marks() == []


# -- only a transaction that inserted a message of a tenant is a publisher of it ------------
#
# The web role may take the outbox's write lock (LOCK TABLE ... IN ROW EXCLUSIVE MODE: its
# INSERT privilege allows it) and any advisory lock, a mark's key included. Neither makes it
# a publisher: a tenant's mark counts beside its proof, a lock whose key only the trigger can
# compute (for that transaction and that tenant).

POSING = {
    "write lock and a mark": [
        "LOCK TABLE outbox_messages IN ROW EXCLUSIVE MODE",
        f"SELECT pg_advisory_xact_lock_shared({B})",
    ],
    "write lock, a mark and a bound": [
        "LOCK TABLE outbox_messages IN ROW EXCLUSIVE MODE",
        f"SELECT pg_advisory_xact_lock_shared({B})",
        "SELECT pg_advisory_xact_lock_shared((28514 << 16), 0)",
    ],
    "a mark beside a message of its own tenant": [
        "PUBLISH A",
        f"SELECT pg_advisory_xact_lock_shared({B})",
    ],
    "a proof copied from another publisher of B": [
        "PUBLISH A",
        f"SELECT pg_advisory_xact_lock_shared({B})",
        "COPY PROOF",
    ],
}


def _pose(conn: psycopg.Connection, statements: list[str]) -> None:
    """Run ``statements`` in ``conn``'s open transaction, as the web role would (injected SQL)."""
    for statement in statements:
        if statement == "PUBLISH A":
            raw_publish(conn, A, "t", {"sku": "its own"})
        elif statement == "COPY PROOF":
            with connect() as honest:  # a real publisher of B, open while its proof is read
                honest.execute("BEGIN")
                raw_publish(honest, B, "t", {"sku": "honest"})
                with observer() as look:
                    proofs = look.execute(
                        "SELECT classid::bigint, objid::bigint FROM pg_locks"
                        " WHERE locktype = 'advisory' AND objsubid = 2 AND pid = %s"
                        " AND classid::bigint >> 16 = 28532", [server_pid(honest)]).fetchall()
                honest.execute("ROLLBACK")
            assert proofs
            for first, second in proofs:  # the same keys, as the two-int4 form takes them
                conn.execute("SELECT pg_advisory_xact_lock_shared(%s::bigint::bit(32)::integer,"
                             " %s::bigint::bit(32)::integer)", [first, second])
        else:
            conn.execute(statement)


# In the variants, each posing directly only: the way changes how the posing session reaches
# PostgreSQL (the pooled way is a pooler already), not the library's statements, all that a
# variant changes; in the variants "direct" goes through the run's pgbouncer as well.
@pytest.mark.parametrize("posing", list(POSING))
@pytest.mark.parametrize("way", [pytest.param("direct", marks=pytest.mark.variants),
                                 "pooled", "prepared"])
def test_a_transaction_that_never_published_for_a_tenant_holds_it_back_in_no_way(
    posing, way, request
):
    """Issue 29, item 5: the web role poses as a publisher of tenant B (the write lock, B's
    mark, a bound, a message of its own tenant A, a proof copied from a real publisher of B;
    directly, through a pooler with one server session, or left as a prepared transaction
    that outlives its session): B's later messages are delivered all the same, and B is
    not named as held anywhere."""
    before = published_elsewhere(B, "before")
    gid = f"dio-pose-{uuid.uuid4().hex[:8]}"
    if way == "pooled":
        pooler = request.getfixturevalue("pooler")
        conn = pooler.connect(app_alias(), autocommit=False)
    else:
        if way == "prepared":
            request.getfixturevalue("prepared_transactions")
        conn = connect(autocommit=False)
    try:
        _pose(conn, POSING[posing])
        if way == "prepared":
            conn.execute(f"PREPARE TRANSACTION '{gid}'")
        later = published_elsewhere(B, "later")
        assert B not in [t for _, t, _ in marks()]
        assert status().held_back == 0 or all(B not in p.tenants for p in status().publishers)
        assert readable()[-2:] == [uuid.UUID(before), uuid.UUID(later)]
    finally:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
        conn.close()
        with observer() as look:
            if look.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", [gid]).fetchone():
                look.execute(f"ROLLBACK PREPARED '{gid}'")


@pytest.mark.variants
def test_a_real_publishers_marks_are_proven_and_still_hold_its_own_tenant_back():
    """The counterpart: the trigger's own marks carry their proof, so an open publisher of
    B holds B's later messages back, as ever (and prepared, as well)."""
    with connect() as publisher:
        publisher.execute("BEGIN")
        own, _ = raw_publish(publisher, B, "t", {"sku": "open"})
        later = published_elsewhere(B, "later")
        assert [t for _, t, _ in marks()] == [B]
        assert uuid.UUID(later) not in readable()
        publisher.execute("COMMIT")
    assert uuid.UUID(later) in readable()


def test_the_reader_refuses_a_snapshot_isolation_that_would_reuse_its_snapshot():
    with connect("system") as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.RaiseException, match="READ COMMITTED"):
            conn.execute("SELECT * FROM outbox_read_v2(0, '{}', 10, NULL, 0, 1)")


@pytest.mark.variants
def test_a_prepared_transaction_that_published_holds_its_tenant_back_until_it_commits(
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
        after = published_elsewhere(A, "after")
        elsewhere = published_elsewhere(B, "elsewhere")
        relay_until(relay, memory, 2)
        drain_relay(relay)
        assert memory.message_ids == [before, elsewhere]
        [publisher] = status().publishers
        assert (publisher.pid, publisher.state, publisher.query) == (None, "prepared", gid)
        assert publisher.tenants == (A,) and publisher.waiting == 1
        call_command("outbox_status")
        assert f"prepared transaction '{gid}'" in capsys.readouterr().out
        with observer() as conn:
            conn.execute(f"COMMIT PREPARED '{gid}'")
    finally:
        with observer() as conn:
            if conn.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", [gid]).fetchone():
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
    relay_until(relay, memory, 4)
    assert memory.message_ids == [before, elsewhere, str(held), after]


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


@pytest.mark.variants
def test_a_consumer_batch_in_flight_holds_nothing_back():
    from outbox.consumers import ensure_offsets, run_batch

    first = publish_as(A, "order.placed", {"sku": "first"})
    consumer = PublishesNothing()
    ensure_offsets(consumer)
    wait_for(lambda: run_batch(consumer).handled >= 1, "the batch")
    relayed = PublishesNothing.relayed_during_batch
    assert relayed[0] == str(first) and len(relayed) == 2  # "newer" too, during the batch


@pytest.mark.variants
def test_a_role_with_insert_only_can_publish_no_grant_on_the_sequence():
    """The marking trigger runs as the tables' owner; a publisher needs INSERT, nothing more."""
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
            assert [(pid, tenant) for pid, tenant, _ in marks()] == [(server_pid(conn), 1)]
            conn.execute("COMMIT")
        finally:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
            conn.execute("REVOKE ALL ON outbox_messages FROM dio_test_insert_only")
            conn.execute("DROP ROLE dio_test_insert_only")
    memory = InMemoryTransport()
    relay_until(Relay(memory, name="test"), memory, 1)


@pytest.mark.variants
def test_a_forged_setting_cannot_let_a_reader_pass_an_open_publisher():
    """``outbox.publishing`` is an ordinary setting that any role may set: written by hand
    before publishing, it makes the trigger skip the bound's mark; the publisher's tenant is
    then held back whole (never passed) while its transaction is open."""
    published_elsewhere(A, "before")
    with connect() as forger:
        forger.execute("BEGIN")
        forger.execute("SELECT set_config('outbox.publishing', pg_current_xact_id()::text, true)")
        row_id, _ = raw_publish(forger, A, "order.placed", {"sku": "forged"})
        after = published_elsewhere(A, "after")
        [(_, tenant, bound)] = marks()
        assert (tenant, bound) == (A, 0)
        assert uuid.UUID(after) not in readable(), "a reader passed an open publisher's tenant"
        forger.execute("ROLLBACK")
    assert uuid.UUID(after) in readable()


def test_readers_of_the_previous_release_are_refused():
    """They would ignore the held tenants and pass their messages by."""
    with connect("system") as conn:
        for statement in ("SELECT * FROM outbox_read(0, 10, NULL, 0, 1)",
                          "SELECT outbox_fence()"):
            with pytest.raises(psycopg.errors.RaiseException, match="earlier release"):
                conn.execute(statement)
            conn.rollback()
