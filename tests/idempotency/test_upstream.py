"""These tests pin upstream behaviour that the idempotent hot path relies on.

A replay costs one round trip, and a new key one for the read, one for the
claim and one for the store (plus the handler's own), because the library
leans on two other projects' behaviour, not on their documented API:

- ``idempotency.core._Coalesce`` recognises Django's ``SAVEPOINT`` and
  ``RELEASE SAVEPOINT`` statements (and ``tenant_context``'s ``SET LOCAL``) by
  their text, holds them back and sends them with the next statement;
- it also sends the ``BEGIN`` that psycopg would send as a round trip of its
  own at the head of that message, with psycopg in autocommit for that one
  execute and its ``_autocommit`` attribute set back afterwards (the public
  setter refuses to change it inside a transaction);
- ``idempotency.store.insert_finished`` appends ``; COMMIT`` to the key's
  INSERT, relying on psycopg's ``commit()`` being a no-op once the server
  reports the transaction finished, so that Django's own commit (and its
  ``on_commit`` callbacks) behave as usual.

And on PostgreSQL's: ``idempotency.store.peek`` sends ``SET LOCAL`` and the
lookup in one simple-query message in autocommit, which the server runs as
one implicit transaction (the setting holds for the lookup, and for nothing
after it).

When an upgrade of Django, psycopg or PostgreSQL changes any of these, a test
here fails and says what changed; the place to adapt is ``_Coalesce``,
``insert_finished`` or ``peek``. Round trips are counted on the wire, from
libpq's own protocol trace: every Query message the client sends is one round
trip.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connections, transaction
from django.db.backends.signals import connection_created
from psycopg import pq

from idempotency import core, store
from tenancy import current_tenant_id, tenant_context
from tenancy.aliases import app_alias
from tenancy.context import search_path_sql
from tests.helpers import app_atomic, app_connection, as_tenant, connect, count_rows, observer
from tests.testapp.models import Order

HELD = core._Coalesce.HELD

# The plain mode's wire; the verified mode's is tested in tests/tenancy/test_verified.py.
pytestmark = pytest.mark.plain_context(reason="counts the plain mode's simple-protocol messages")


class Wire:
    """The messages Django's connections send to PostgreSQL, as libpq traces them."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile("w+")

    def attach(self, pgconn: Any) -> None:
        pgconn.trace(self.file.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    def sent(self) -> list[tuple[str, str]]:
        """``(message type, text)`` of every frontend message, in order."""
        self.file.flush()
        self.file.seek(0)
        messages: list[str] = []
        for line in self.file.read().splitlines():
            if line.startswith(("F\t", "B\t")):
                messages.append(line)
            elif messages:  # a query's text spans lines
                messages[-1] += "\n" + line
        sent = []
        for message in messages:
            fields = message.split("\t", 3)
            if fields[0] == "F":
                sent.append((fields[2], fields[3] if len(fields) > 3 else ""))
        return sent

    def round_trips(self) -> list[str]:
        """The text of each query sent, one per round trip.

        Fails if anything but simple Query messages went out (the extended
        protocol would mean psycopg now binds on the server, and cannot run
        a held statement and ours in one message).
        """
        sent = [(kind, text) for kind, text in self.sent() if kind != "Terminate"]
        assert {kind for kind, _ in sent} <= {"Query"}, sent
        return [re.fullmatch(r' ?"(.*)"', text, re.DOTALL).group(1).strip() for _, text in sent]


@contextlib.contextmanager
def wire() -> Iterator[Wire]:
    """Trace this thread's default connection, as it is now or as it is opened in the block."""
    traced = Wire()
    thread = threading.get_ident()

    def on_connect(sender: Any, connection: Any, **kwargs: Any) -> None:
        if connection.alias == app_connection().alias and threading.get_ident() == thread:
            traced.attach(connection.connection.pgconn)

    if app_connection().connection is not None:
        traced.attach(app_connection().connection.pgconn)
    connection_created.connect(on_connect)
    try:
        yield traced
    finally:
        connection_created.disconnect(on_connect)
        if app_connection().connection is not None and not app_connection().connection.closed:
            app_connection().connection.pgconn.untrace()


def alone(statement: str) -> bool:
    """A statement that _Coalesce should have held, sent as a round trip of its own."""
    return statement.startswith(HELD) and ";" not in statement


# The request path's statements, as text or as their prepared form
# (idempotency.store: prepared where the alias is not pooled,
# tests/idempotency/test_prepared.py pins which one goes when).
def reads_key(message: str) -> bool:
    """The message ends with the key's read (no lock)."""
    last = message.rsplit("; ", 1)[-1]
    return last.startswith(f"EXECUTE {store._PEEK_STATEMENT.name}(") or (
        "LEFT JOIN idempotency_keys" in last and "pg_try_advisory_xact_lock" not in last)


def claims_key(message: str) -> bool:
    """The message ends with the key's lookup and lock."""
    last = message.rsplit("; ", 1)[-1]
    return last.startswith(f"EXECUTE {store._CLAIM_STATEMENT.name}(") or (
        "LEFT JOIN idempotency_keys" in last and "pg_try_advisory_xact_lock" in last)


def stores_key(message: str) -> bool:
    """The message ends with the key's INSERT and COMMIT."""
    statements = message.split("; ")
    return statements[-1] == "COMMIT" and (
        statements[-2].startswith(f"EXECUTE {store._STORE_STATEMENT.name}(")
        or statements[-2].lstrip().startswith("INSERT INTO idempotency_keys"))


def request(key: str = "k", fingerprint: str = "f" * 64) -> core.IdempotentRequest:
    return core.IdempotentRequest(
        tenant_id=1, scope="upstream", key=key, fingerprint=fingerprint, method="POST", path="/x"
    )


def stored(status: int = 201, body: bytes = b"{}") -> core.StoredResponse:
    return core.StoredResponse(status, body, (("Content-Type", "application/json"),))


def idle() -> bool:
    return app_connection().connection.info.transaction_status is pq.TransactionStatus.IDLE


# --- Django's statements, recognised by their text --------------------------------------


def test_djangos_savepoint_sql_starts_with_the_prefixes_coalesce_holds():
    create = app_connection().ops.savepoint_create_sql("s1_x1")
    release = app_connection().ops.savepoint_commit_sql("s1_x1")
    assert create.startswith("SAVEPOINT ") and "SAVEPOINT " in HELD, create
    assert release.startswith("RELEASE SAVEPOINT ") and "RELEASE SAVEPOINT " in HELD, release


def test_atomic_and_tenant_context_send_exactly_the_statements_coalesce_holds():
    # _Coalesce holds a statement only when it comes through execute() alone,
    # without parameters: that is how Django's atomic() and tenant_context send them.
    calls: list[tuple[str, Any, bool]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        calls.append((sql, params, many))
        return execute(sql, params, many, context)

    with app_connection().execute_wrapper(capture), tenant_context(1), app_atomic():
        pass
    statements = [sql for sql, _, _ in calls]
    assert statements[0] == f"SET LOCAL app.tenant_id = '1'; {search_path_sql(app_alias())}"
    assert [s.split('"')[0] for s in statements[1:]] == [
        "SAVEPOINT ", "RELEASE SAVEPOINT "
    ], statements
    assert all(s.startswith(HELD) for s in statements)
    assert all(params is None and not many for _, params, many in calls), calls


# --- round trips on the wire ----------------------------------------------------------


def test_a_new_key_is_a_read_a_claim_and_a_store():
    modes: list[tuple[bool, pq.TransactionStatus]] = []

    def handler() -> core.StoredResponse:
        # psycopg is where its own BEGIN would have left it: in a transaction, not autocommit.
        raw = app_connection().connection
        modes.append((raw.autocommit, raw.info.transaction_status))
        Order.objects.create(tenant_id=current_tenant_id(), sku="tea")
        return stored()

    app_connection().ensure_connection()
    with wire() as traced:
        result = core.execute(request(), handler, lambda r: r)
    assert result.outcome is core.Outcome.EXECUTED
    sent = traced.round_trips()
    assert not [s for s in sent if alone(s)], f"a held statement went out alone: {sent}"
    assert "BEGIN" not in sent, f"psycopg sent its BEGIN as a round trip of its own: {sent}"
    peek, claim, order, stored_ = sent  # and no COMMIT of its own after the store
    assert peek.startswith(f"SET LOCAL app.tenant_id = '1'; {search_path_sql(app_alias())}; ")
    assert reads_key(peek), peek
    pinned = f"BEGIN; SET LOCAL app.tenant_id = '1'; {search_path_sql(app_alias())}; "
    assert claim.startswith(pinned), claim
    # The handler's savepoint after the key's lock (idempotency.core._HandlerSavepoint).
    claim, savepoint = claim.rsplit("; ", 1)
    assert savepoint.startswith('SAVEPOINT "'), savepoint
    assert claims_key(claim), claim
    assert order.startswith('INSERT INTO "testapp_order"'), order
    assert stored_.startswith("RELEASE SAVEPOINT "), stored_
    assert stores_key(stored_), stored_
    assert modes == [(False, pq.TransactionStatus.INTRANS)]
    assert idle() and app_connection().connection.autocommit is True


def test_a_replay_is_one_indexed_read_and_no_transaction():
    core.execute(request(), stored, lambda r: r)
    app_connection().ensure_connection()
    with wire() as traced:
        result = core.execute(request(), stored, lambda r: r)
    assert result.outcome is core.Outcome.REPLAYED
    sent = traced.round_trips()
    assert len(sent) == 1, sent
    assert sent[0].startswith("SET LOCAL app.tenant_id = '1'; "), sent
    assert reads_key(sent[0]) and "BEGIN" not in sent[0]
    assert idle() and app_connection().get_autocommit()


def test_through_the_drf_mixin_a_new_key_and_a_replay_cost_the_same(client):
    # The whole request, on the connection the request opens.
    with wire() as traced:
        assert client.order(key="wire").status_code == 201
    sent = traced.round_trips()
    assert not [s for s in sent if alone(s)], f"a held statement went out alone: {sent}"
    assert len(sent) == 4, sent  # the read, BEGIN + claim, the order's INSERT, store + COMMIT
    assert sent[1].startswith("BEGIN; ")
    assert sent[-1].startswith("RELEASE SAVEPOINT ") and sent[-1].endswith("; COMMIT")
    with wire() as traced:
        assert client.order(key="wire")["Idempotent-Replayed"] == "true"
    assert len(traced.round_trips()) == 1


# --- psycopg's BEGIN, sent by _Coalesce ----------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{}, {"isolation_level": psycopg.IsolationLevel.REPEATABLE_READ, "read_only": False},
     {"isolation_level": psycopg.IsolationLevel.SERIALIZABLE, "read_only": True,
      "deferrable": True}],
    ids=["default", "repeatable-read", "serializable-read-only-deferrable"],
)
def test_the_begin_coalesce_sends_is_the_one_psycopg_would_send(options):
    traced = Wire()
    with connect() as conn:
        for name, value in options.items():
            setattr(conn, name, value)
        expected = core.begin_statement(conn)
        traced.attach(conn.pgconn)
        conn.execute("SELECT 1")  # psycopg begins the transaction itself
        conn.pgconn.untrace()
        conn.rollback()
        assert core.begin_statement(conn) == expected
    assert traced.round_trips()[0] == expected, traced.round_trips()


def test_psycopg_keeps_its_autocommit_mode_in_the_attribute_coalesce_sets_back():
    # What _Coalesce does with psycopg when it sends BEGIN itself: psycopg
    # must then be exactly where its own BEGIN would have left it.
    traced = Wire()
    with connect() as conn:
        assert conn.autocommit is False
        traced.attach(conn.pgconn)
        conn.autocommit = True
        conn.execute("BEGIN; SELECT 1")
        conn._autocommit = False
        assert conn.autocommit is False
        assert conn.info.transaction_status is pq.TransactionStatus.INTRANS
        with pytest.raises(psycopg.ProgrammingError):
            conn.autocommit = True  # why the attribute: the setter refuses in a transaction
        conn.execute("SELECT 2")  # no second BEGIN
        conn.commit()  # a COMMIT is sent
        conn.execute("SELECT 3")  # and the next statement begins a new transaction
        conn.pgconn.untrace()
        conn.rollback()
    assert traced.round_trips() == ["BEGIN; SELECT 1", "SELECT 2", "COMMIT", "BEGIN", "SELECT 3"]


def test_a_failed_claim_message_leaves_a_transaction_django_rolls_back():
    # The claim message is BEGIN; SET LOCAL; lookup; SAVEPOINT. If the lookup
    # fails, the BEGIN has run: atomic() must roll back, and the connection
    # must be usable, in autocommit, afterwards.
    def broken(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if claims_key(sql):  # as text, or the EXECUTE of its prepared form
            sql = sql.replace("LEFT JOIN idempotency_keys", "LEFT JOIN no_such_table").replace(
                f"EXECUTE {store._CLAIM_STATEMENT.name}(", "SELECT * FROM no_such_table(")
        return execute(sql, params, many, context)

    app_connection().ensure_connection()
    with app_connection().execute_wrapper(broken), pytest.raises(Exception, match="no_such_table"):
        core.execute(request(), stored, lambda r: r)
    assert idle() and app_connection().get_autocommit() and not app_connection().in_atomic_block
    assert app_connection().connection.autocommit is True
    assert core.execute(request(), stored, lambda r: r).outcome is core.Outcome.EXECUTED


# --- SET LOCAL in a one-message read (store.peek) ------------------------------------------


def test_set_local_in_a_message_in_autocommit_holds_for_that_message_only():
    with connect(autocommit=True) as conn:
        cur = psycopg.ClientCursor(conn)
        cur.execute("SET LOCAL app.tenant_id = '7'; SELECT current_setting('app.tenant_id')")
        cur.nextset()
        assert cur.fetchone() == ("7",)
        assert conn.info.transaction_status is pq.TransactionStatus.IDLE
        after = conn.execute("SELECT current_setting('app.tenant_id', true)").fetchone()[0]
        assert after in (None, "")


# --- "; COMMIT" and psycopg's commit() ---------------------------------------------------


def test_psycopg_commit_sends_nothing_once_the_server_finished_the_transaction():
    traced = Wire()
    with connect() as conn:  # not autocommit: psycopg sends BEGIN itself
        traced.attach(conn.pgconn)
        conn.execute("SELECT 1; COMMIT")
        assert conn.info.transaction_status is pq.TransactionStatus.IDLE
        conn.commit()
        conn.pgconn.untrace()
    assert traced.round_trips() == ["BEGIN", "SELECT 1; COMMIT"]


def test_after_a_new_key_the_transaction_is_committed_and_on_commit_ran_once():
    ran: list[tuple[int, int]] = []

    def handler() -> core.StoredResponse:
        Order.objects.create(tenant_id=current_tenant_id(), sku="tea")
        # Counted from a second connection: the callback runs after the real commit.
        transaction.on_commit(
            lambda: ran.append((count_rows("testapp_order"), count_rows("idempotency_keys"))),
            using=app_alias(),
        )
        return stored()

    app_connection().ensure_connection()
    with wire() as traced:
        result = core.execute(request(), handler, lambda r: r)
    assert result.outcome is core.Outcome.EXECUTED
    assert traced.round_trips()[-1].endswith("; COMMIT")  # the merged commit was the one
    assert ran == [(1, 1)]
    assert count_rows("testapp_order") == 1 and count_rows("idempotency_keys") == 1
    assert idle() and not app_connection().in_atomic_block


def store_as_racer() -> None:
    """Store key "k" as another request would, from another session (this thread's)."""
    try:
        with tenant_context(1):
            assert store.insert_finished(
                app_alias(), request(), stored(body=b"racer"), "completed", timedelta(hours=1),
                commit=False,
            )
    finally:
        connections.close_all()


def test_when_the_merged_insert_fails_nothing_of_the_handlers_writes_is_committed():
    ran: list[str] = []
    attempts: list[int] = []

    def handler() -> core.StoredResponse:
        attempts.append(1)
        Order.objects.create(tenant_id=current_tenant_id(), sku="ours")
        transaction.on_commit(lambda: ran.append("ours"), using=app_alias())
        # A racer commits the same key between our lookup and our store.
        racer = threading.Thread(target=store_as_racer)
        racer.start()
        racer.join(10)
        return stored(body=b"ours")

    app_connection().ensure_connection()
    with wire() as traced:
        result = core.execute(request(), handler, lambda r: r)
    sent = traced.round_trips()
    failed = next(i for i, s in enumerate(sent) if stores_key(s))
    assert sent[failed].endswith("; COMMIT"), sent[failed]
    assert sent[failed + 1] == "ROLLBACK", sent  # the COMMIT after the failed INSERT never ran
    assert result.outcome is core.Outcome.REPLAYED and result.stored.body == b"racer"
    assert attempts == [1] and ran == []
    assert count_rows("testapp_order") == 0
    with observer() as o:
        assert o.execute("SELECT response FROM idempotency_keys").fetchone()[0] == b"racer"
    assert idle() and not app_connection().in_atomic_block


def test_the_unique_violation_is_recognised_by_the_constraint_psycopg_reports():
    # store._is_key_conflict tells a lost race from the handler's own errors
    # by psycopg's diag.constraint_name.
    store_as_racer()
    with connect() as conn, as_tenant(conn, 1) as cur:
        with pytest.raises(psycopg.errors.UniqueViolation) as raised, conn.transaction():
            cur.execute("INSERT INTO idempotency_keys SELECT * FROM idempotency_keys")
    assert raised.value.diag.constraint_name == "idempotency_keys_pkey"
