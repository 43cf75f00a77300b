"""What the idempotent hot path costs on the wire, and the upstream behaviour it leans on.

A replay costs one round trip, and a new key one for the read, one for the
claim, one for the handler's statements and one for the store, because:

- the database backend holds ``BEGIN``, the tenant's ``SET LOCAL``,
  ``SAVEPOINT`` and ``RELEASE SAVEPOINT`` and sends each with the next
  statement (tenancy.backends.postgresql, through the hooks Django calls on a
  backend: tests/tenancy/test_backend.py holds them);
- ``idempotency.store.insert_finished`` appends ``; COMMIT`` to the key's
  store, relying on psycopg's ``commit()`` sending nothing once the server
  reports the transaction finished, so that Django's own commit (and its
  ``on_commit`` callbacks) behave as usual;
- ``idempotency.store.peek`` sends ``SET LOCAL`` and the lookup in one
  simple-query message in autocommit, which PostgreSQL runs as one implicit
  transaction (the setting holds for the lookup, and for nothing after it).

When an upgrade of Django, psycopg or PostgreSQL changes any of these, a test
here fails and says what changed. Round trips are counted on the wire, from
libpq's own protocol trace (tests/wire.py).
"""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import connections, transaction
from psycopg import pq

from idempotency import core, store
from tenancy import current_tenant_id, tenant_context
from tenancy.aliases import app_alias
from tenancy.context import search_path_sql
from tests.helpers import app_connection, as_tenant, connect, count_rows, observer
from tests.testapp.models import Order
from tests.wire import Wire, wire

# The plain mode's wire; the verified mode's is tested in tests/tenancy/test_verified.py.
pytestmark = pytest.mark.plain_context(reason="counts the plain mode's simple-protocol messages")


def request(key: str = "k", fingerprint: str = "f" * 64) -> core.IdempotentRequest:
    return core.IdempotentRequest(
        tenant_id=1, scope="upstream", key=key, fingerprint=fingerprint, method="POST", path="/x"
    )


def stored(status: int = 201, body: bytes = b"{}") -> core.StoredResponse:
    return core.StoredResponse(status, body, (("Content-Type", "application/json"),))


def idle() -> bool:
    return app_connection().connection.info.transaction_status is pq.TransactionStatus.IDLE


def lookup(lock: bool) -> str:
    """The key's read as this module's request() sends it (its lock id, or NULL)."""
    lock_id = request().lock_id if lock else "NULL"
    return store.SQL["lookup"].replace(
        "%(tenant_id)s, %(scope)s, %(key)s, %(lock_id)s", f"1, 'upstream', 'k', {lock_id}")


# --- round trips on the wire ----------------------------------------------------------


def test_a_new_key_is_a_read_a_claim_the_handler_and_a_store():
    def handler() -> core.StoredResponse:
        Order.objects.create(tenant_id=current_tenant_id(), sku="tea")
        return stored()

    app_connection().ensure_connection()
    with wire() as traced:
        result = core.execute(request(), handler, lambda r: r)
    assert result.outcome is core.Outcome.EXECUTED
    pin = search_path_sql(app_alias())
    peek, claim, order, stored_ = traced.round_trips()  # no COMMIT of its own after the store
    assert peek == f"SET LOCAL app.tenant_id = '1'; {pin}; {lookup(lock=False)}", peek
    assert claim == f"BEGIN; SET LOCAL app.tenant_id = '1'; {pin}; {lookup(lock=True)}", claim
    # The handler's savepoint, after the key's lock, with the handler's first statement.
    savepoint, insert = order.split("; ", 1)
    assert savepoint.startswith('SAVEPOINT "') and insert.startswith('INSERT INTO "testapp_order"')
    release, call, commit = stored_.split("; ")
    assert release.startswith('RELEASE SAVEPOINT "') and commit == "COMMIT", stored_
    assert call.startswith("SELECT idempotency_store(1, 'upstream', 'k', "), call
    assert idle() and app_connection().connection.autocommit is True


def test_a_replay_is_one_indexed_read_and_no_transaction():
    core.execute(request(), stored, lambda r: r)
    app_connection().ensure_connection()
    with wire() as traced:
        result = core.execute(request(), stored, lambda r: r)
    assert result.outcome is core.Outcome.REPLAYED
    pin = search_path_sql(app_alias())
    assert traced.round_trips() == [f"SET LOCAL app.tenant_id = '1'; {pin}; {lookup(lock=False)}"]
    assert idle() and app_connection().get_autocommit()


def test_through_the_drf_mixin_a_new_key_and_a_replay_cost_the_same(client):
    # The whole request, on the connection the request opens.
    with wire() as traced:
        assert client.order(key="wire").status_code == 201
    sent = traced.round_trips()
    assert len(sent) == 4, sent  # the read, BEGIN + claim, the order's INSERT, store + COMMIT
    assert sent[1].startswith("BEGIN; ") and sent[2].startswith('SAVEPOINT "')
    assert sent[-1].startswith("RELEASE SAVEPOINT ") and sent[-1].endswith("; COMMIT")
    with wire() as traced:
        assert client.order(key="wire")["Idempotent-Replayed"] == "true"
    assert len(traced.round_trips()) == 1


def test_a_final_4xx_without_a_statement_of_the_handler_sends_no_savepoint():
    # The savepoint was never sent, so there is nothing to roll back to: the
    # store follows the claim, and the key's lock was never inside a savepoint.
    app_connection().ensure_connection()
    with wire() as traced:
        result = core.execute(request(), lambda: stored(422), lambda r: r)
    assert result.verdict is core.Verdict.FAILED
    claim, stored_ = traced.round_trips()[1:]
    assert "SAVEPOINT" not in claim + stored_, (claim, stored_)
    assert count_rows("idempotency_keys", "state = 'failed'") == 1


def test_a_failed_claim_leaves_a_transaction_django_rolls_back():
    # The claim's message is BEGIN; SET LOCAL; lookup. If the lookup fails, the
    # BEGIN has run: atomic() must roll back, and the connection must be
    # usable, in autocommit, afterwards, holding nothing.
    def broken(execute, sql, params, many, context):  # noqa: ANN001, ANN202
        if "idempotency_lookup(" in sql and params.get("lock_id") is not None:
            sql = sql.replace("idempotency_lookup(", "no_such_function(")
        return execute(sql, params, many, context)

    app_connection().ensure_connection()
    with app_connection().execute_wrapper(broken), pytest.raises(Exception, match="no_such"):
        core.execute(request(), stored, lambda r: r)
    assert idle() and app_connection().get_autocommit() and not app_connection().in_atomic_block
    assert app_connection().held.statements == []
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
    failed = next(i for i, s in enumerate(sent) if "idempotency_store(" in s)
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
