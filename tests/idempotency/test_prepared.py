"""The request path's statements are prepared where a server session is the connection's own.

``idempotency.store`` prepares the key's read, claim and store once per
connection, with SQL ``PREPARE`` in the connection's first read (no round
trip of its own), on an alias that is not pooled
(``tenancy.context.pooled``), and sends ``EXECUTE`` from then on. Through a
pooler nothing is ever prepared: the next borrower of the server session
would find a name it did not prepare. These tests hold both, on the wire
(libpq's trace, as tests/idempotency/test_upstream.py counts round trips)
and in the server session itself (``pg_prepared_statements``), through a
private pgbouncer whose pool holds one server session.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from rest_framework.test import APIClient

from idempotency import core, store
from tenancy.aliases import app_alias
from tenancy.context import pooled, search_path_sql
from tenancy.statements import Statement
from tests.helpers import app_connection, count_rows, observer
from tests.idempotency.test_upstream import request, stored, wire
from tests.pooler import connection_settings
from tests.tenancy.test_pinned_names import shadow, temporary_allowed  # noqa: F401 (a fixture)

pytestmark = pytest.mark.plain_context(
    reason="the verified mode reads no key in autocommit, so it prepares nothing"
)

NAMES = sorted(statement.name for statement in store._PREPARED)

direct_only = pytest.mark.direct_sessions(
    "default", reason="prepares only where the app alias has server sessions of its own"
)


def prepared_here() -> list[str]:
    """The library's statements prepared in the app alias's server session now."""
    with app_connection().cursor() as cursor:
        cursor.execute(
            "SELECT name FROM pg_prepared_statements WHERE name LIKE 'idempotency\\_%' ORDER BY 1"
        )
        return [row[0] for row in cursor.fetchall()]


def new_key(key: str) -> core.Result[Any]:
    result = core.execute(request(key), stored, lambda r: r)
    assert result.outcome is core.Outcome.EXECUTED
    return result


def replay(key: str) -> None:
    assert core.execute(request(key), stored, lambda r: r).outcome is core.Outcome.REPLAYED


# --- a direct alias ---------------------------------------------------------------------


@direct_only
def test_a_direct_alias_is_not_pooled():
    assert pooled(app_alias()) is False


@direct_only
def test_the_first_read_of_a_connection_prepares_the_three_statements_in_its_one_message(fresh):
    app_connection().ensure_connection()
    with wire() as traced:
        new_key("first")
    peek, claim, store_ = traced.round_trips()  # one message each, as before (no handler SQL)
    pinned = f"SET LOCAL app.tenant_id = '1'; {search_path_sql(app_alias())}; "
    assert peek.startswith(pinned + "PREPARE "), peek
    assert [f"PREPARE {name} " in peek for name in NAMES] == [True, True, True]
    assert peek.endswith(f"EXECUTE {store._PEEK_STATEMENT.name}(1, 'upstream', 'first')"), peek
    claimed, savepoint = claim.rsplit("; ", 2)[-2:]  # the handler's savepoint after the lock
    assert savepoint.startswith('SAVEPOINT "'), savepoint
    assert claimed.startswith(f"EXECUTE {store._CLAIM_STATEMENT.name}(")  # the lock id, the key
    assert claimed.endswith(", 1, 'upstream', 'first')"), claimed
    assert f"; EXECUTE {store._STORE_STATEMENT.name}(1, 'upstream', 'first', " in store_
    assert prepared_here() == NAMES
    # The next requests on the connection send EXECUTE only.
    with wire() as traced:
        new_key("second")
        replay("second")
    sent = traced.round_trips()
    assert len(sent) == 4, sent  # read, claim, store; then the replay's one read
    assert not [message for message in sent if "PREPARE" in message], sent
    assert sent[0] == pinned + f"EXECUTE {store._PEEK_STATEMENT.name}(1, 'upstream', 'second')"
    assert sent[3] == sent[0]
    assert count_rows("idempotency_keys") == 2


@direct_only
def test_statements_someone_deallocated_are_prepared_again_by_the_next_read(fresh):
    new_key("k")
    with app_connection().cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # or DISCARD ALL, by code that shares the connection
    assert prepared_here() == []
    with wire() as traced:
        replay("k")
    failed, again = traced.round_trips()  # the read found them gone, and prepared them again
    assert "PREPARE" not in failed and "PREPARE" in again, (failed, again)
    assert prepared_here() == NAMES
    new_key("k2")
    replay("k2")


@direct_only
def test_after_a_failed_first_read_the_connection_sends_its_statements_as_text(fresh):
    # The PREPAREs run first and stay with the session even though the
    # message fails after them, which the library cannot tell from the error:
    # it sends the statements as text on that connection from then on (a
    # second PREPARE of a name would fail, as would an EXECUTE of a missing one).
    def broken(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "PREPARE" in sql:
            sql = sql.replace(f"EXECUTE {store._PEEK_STATEMENT.name}(", "SELECT * FROM nowhere(")
        return execute(sql, params, many, context)

    app_connection().ensure_connection()
    with app_connection().execute_wrapper(broken), pytest.raises(Exception, match="nowhere"):
        new_key("k")
    assert prepared_here() == NAMES  # they did run
    with wire() as traced:
        new_key("k")
        replay("k")
    sent = traced.round_trips()
    assert not [m for m in sent if "PREPARE" in m or "EXECUTE" in m], sent
    assert count_rows("idempotency_keys") == 1


@direct_only
def test_prepared_statements_name_the_library_tables_whatever_the_session_left_later(
    fresh, temporary_allowed  # noqa: F811 (the fixture, imported)
):
    # Prepared before the earlier borrower's temporary table and search_path
    # appear: each EXECUTE runs under the pinned search_path, which PostgreSQL
    # compares with the one the statement was analysed under.
    api = APIClient()
    app = app_alias()
    saved = app_connection().settings_dict["CONN_MAX_AGE"]
    app_connection().settings_dict["CONN_MAX_AGE"] = None  # one session across the requests
    try:
        first = api.post("/orders/", {"sku": "tea"}, format="json",
                         headers={"X-User": "alice", "Idempotency-Key": "k1"})
        assert prepared_here() == NAMES
        with connections[app].cursor() as cursor:
            cursor.execute(shadow("idempotency_keys"))
            cursor.execute(
                "INSERT INTO pg_temp.idempotency_keys (tenant_id, scope, key, request_hash,"
                " request_method, request_path, state, status_code, response, response_headers,"
                " expires_at) VALUES (1, 'order.create', 'planted', 'x', 'POST', '/',"
                " 'completed', 201, '{\"planted\": true}', '[]', now() + interval '1 day')")
            cursor.execute("SET search_path = pg_temp, public")
        again = api.post("/orders/", {"sku": "tea"}, format="json",
                         headers={"X-User": "alice", "Idempotency-Key": "k1"})
        planted = api.post("/orders/", {"sku": "tea"}, format="json",
                           headers={"X-User": "alice", "Idempotency-Key": "planted"})
        with connections[app].cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_temp.idempotency_keys")
            assert cursor.fetchone() == (1,)  # untouched
    finally:
        app_connection().settings_dict["CONN_MAX_AGE"] = saved
    assert first.status_code == 201
    assert again.headers.get("Idempotent-Replayed") == "true" and again.content == first.content
    assert planted.status_code == 201 and "Idempotent-Replayed" not in planted.headers
    assert count_rows("idempotency_keys") == 2


def test_a_statements_name_is_its_purpose_and_its_text():
    peek = store._PEEK_STATEMENT
    assert peek.name.startswith("idempotency_peek_")
    again = Statement.of("idempotency_peek", peek.sql + " ", store._PARAM_TYPES)
    assert again.name != peek.name  # one name, one meaning
    assert peek.prepare.startswith(f"PREPARE {peek.name} (bigint, text, text) AS SELECT ")
    assert peek.call == f"EXECUTE {peek.name}(%(tenant_id)s, %(scope)s, %(key)s)"
    assert "%(" not in store._CLAIM_STATEMENT.prepare and "$4" in store._CLAIM_STATEMENT.prepare


# --- through a pooler ---------------------------------------------------------------------


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "undeclared"])
def test_a_pooled_alias_never_prepares_and_leaves_no_statement_in_the_session(pooler, declared):
    app = app_alias()
    with pooler.through(app_alias(), declared=declared):
        assert pooled(app) is True
        app_connection().ensure_connection()
        with wire() as traced:
            new_key("k")
            replay("k")
            new_key("k2")
        api = APIClient()
        created = api.post("/orders/", {"sku": "tea"}, format="json",
                           headers={"X-User": "alice", "Idempotency-Key": "api"})
        replayed = api.post("/orders/", {"sku": "tea"}, format="json",
                            headers={"X-User": "alice", "Idempotency-Key": "api"})
        sent = traced.round_trips()
        # The next borrower of the pool's one server session finds nothing prepared.
        with pooler.connect() as borrower:
            left = borrower.execute("SELECT name FROM pg_prepared_statements").fetchall()
    assert left == []
    assert not [m for m in sent if "PREPARE" in m or "EXECUTE" in m], sent
    assert len(sent) == 7, sent  # 3 + 1 + 3 round trips, as on a direct alias
    assert created.status_code == 201
    assert replayed.headers.get("Idempotent-Replayed") == "true"
    assert count_rows("idempotency_keys") == 3


# --- psycopg's protocol-level preparing (the opt-in behind pgbouncer 1.21+) ------------------


@pytest.fixture
def server_side_binding() -> Iterator[None]:
    """The app alias binds parameters on the server, and psycopg prepares, as documented."""
    options = app_connection().settings_dict.get("OPTIONS", {})
    with connection_settings(app_alias(), OPTIONS={
        **options, "server_side_binding": True, "prepare_threshold": 5,
    }):
        yield


def messages(traced: Any) -> int:
    """Round trips on the wire: simple Query messages, and extended-protocol Syncs."""
    return len([kind for kind, _ in traced.sent() if kind in ("Query", "Sync")])


@direct_only
def test_on_a_cursor_that_binds_on_the_server_the_library_leaves_preparing_to_psycopg(
    server_side_binding,
):
    from outbox import publish
    from tenancy import tenant_context

    for n in range(6):  # psycopg prepares a statement once it has sent it five times
        new_key(f"warm-{n}")
        replay(f"warm-{n}")
    with wire() as traced:
        new_key("second")
    new = messages(traced)
    with wire() as traced:
        replay("second")
    replayed = messages(traced)
    with tenant_context(1):
        publish("order.placed", {"n": 1})
    with app_connection().cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements ORDER BY 1")
        names = [row[0] for row in cursor.fetchall()]
    assert names and all(name.startswith("_pg3_") for name in names), names  # psycopg's only
    # One statement per round trip: BEGIN, the tenant, the pin, the lookup, then for a
    # new key SAVEPOINT (after the lock), RELEASE, the key's INSERT and COMMIT; for a
    # replay COMMIT (no savepoint: the handler does not run).
    assert (new, replayed) == (8, 5), (new, replayed)
    assert count_rows("idempotency_keys") == 7 and count_rows("outbox_messages") == 1


# --- what a connection's prepared statements must survive ---------------------------------


@direct_only
def test_a_closed_connection_is_not_kept_alive_by_the_kept_cursor():
    """The library keeps one psycopg cursor per Django connection; a connection Django closed
    (after every request with CONN_MAX_AGE = 0) must not stay in memory through it."""
    import gc
    import weakref

    from tenancy import statements

    closed = []
    for _ in range(5):
        connection = app_connection()
        connection.ensure_connection()
        statements.cursor(app_alias()).execute("SELECT 1")
        closed.append(weakref.ref(connection.connection))
        connection.close()
    statements.cursor(app_alias()).execute("SELECT 1")  # the next connection's cursor
    gc.collect()
    assert [ref() is None for ref in closed] == [True] * 5


@direct_only
def test_a_column_whose_type_a_migration_changed_is_read_as_text_from_then_on(fresh):
    """PostgreSQL refuses, for the session's life, an EXECUTE whose result type changed since
    the PREPARE ("cached plan must not change result type"). A migration that changes a column
    of the key's row while connections stay open (CONN_MAX_AGE = None) must not make their
    keyed requests fail: the session's statements are sent as text from then on."""
    new_key("before")
    assert prepared_here() == NAMES
    with observer() as owner:
        owner.execute("ALTER TABLE idempotency_keys ALTER COLUMN status_code TYPE integer")
    try:
        replay("before")  # the peek's EXECUTE is refused; sent again as text
        new_key("after")  # the claim and the store as text too
        replay("after")
        with wire() as traced:
            replay("after")
        assert "EXECUTE" not in traced.round_trips()[0]
    finally:
        app_connection().close()
        with observer() as owner:
            owner.execute("ALTER TABLE idempotency_keys ALTER COLUMN status_code TYPE smallint")


@direct_only
def test_a_name_someone_else_prepared_is_never_executed(fresh):
    """docs/roles.md: on a direct connection the library runs by name only what it prepared
    itself there. A statement prepared under one of its names before its first read (a leftover
    on a persistent connection) makes that read's PREPARE fail once; the connection then sends
    the statements as text, never the foreign one."""
    with app_connection().cursor() as cursor:
        cursor.execute(f"PREPARE {store._PEEK_STATEMENT.name} (bigint, text, text) AS"
                       " SELECT NULL::bool, NULL::bool, NULL::bool, NULL::bigint, NULL::text,"
                       " 'completed'::text, 200::smallint, NULL::bytea, NULL::jsonb")
    with pytest.raises(Exception, match="already exists"):
        new_key("foreign")
    with wire() as traced:
        new_key("foreign")
        replay("foreign")
    sent = traced.round_trips()
    assert not [m for m in sent if "PREPARE" in m or "EXECUTE" in m], sent
    assert count_rows("idempotency_keys") == 1
