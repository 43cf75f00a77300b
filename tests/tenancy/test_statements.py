"""What the library sends is what it wrote, whatever ran on the connection before.

The library prepares nothing and runs nothing by name: its statements are
text from its query files (django_idempotency_outbox.sqlfiles), sent through
a Django cursor, and the hot ones call PL/pgSQL functions that only the
tables' owner can create or change, whose plans PostgreSQL keeps per server
session (idempotency/sql/0008_request_functions.sql,
outbox/sql/0009_publish_function.sql). SQL of the web role's, run earlier on
a kept connection or left in a pooled server session by another tenant's
request (docs/roles.md, "The threat model"), can prepare, deallocate and set
what it likes: the next request executes none of it, and gets its own
tenant's answer. These tests hold that directly and through a pgbouncer whose
pool has one server session, in the plain and the verified mode.
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from outbox import publish
from tenancy import tenant_context
from tenancy.aliases import app_alias
from tests.helpers import app_connection, connect, count_rows, observer
from tests.tenancy.test_pinned_names import Direct, temporary_allowed  # noqa: F401
from tests.wire import wire

# make test-variants runs the tests marked `variants` again: those that send a statement
# through the library's aliases, which a deployment variant can change (docs/contributing.md).

A, B = 1, 2

direct_only = pytest.mark.direct_sessions(
    "default", reason="keeps one direct server session across the requests"
)

#: What an earlier request's injected SQL leaves on the session: statements
#: prepared under the names earlier releases of the library gave its hot
#: statements (any name would do), answering a forged finished key, and a
#: statement named as psycopg names its own.
FORGERIES = [
    "PREPARE idempotency_peek_forged (bigint, text, text) AS SELECT true, NULL::bool, false,"
    " NULL::bigint, 'forged'::text, 'completed'::text, 200, '\\x666f72676564'::bytea, '[]'::jsonb",
    "PREPARE outbox_insert_forged AS SELECT 1",
    "PREPARE _pg3_0 AS SELECT 1",
]


def post(api: APIClient, key: str, user: str = "bob") -> object:
    return api.post("/orders/", {"sku": "tea"}, format="json",
                    headers={"X-User": user, "Idempotency-Key": key})


def keep_connection() -> pytest.MonkeyPatch:
    patch = pytest.MonkeyPatch()
    patch.setitem(app_connection().settings_dict, "CONN_MAX_AGE", None)
    return patch


@pytest.mark.variants
@direct_only
def test_statements_prepared_earlier_on_a_kept_connection_are_never_executed(fresh):
    api = APIClient()
    patch = keep_connection()
    try:
        Direct().leave(app_alias(), "DEALLOCATE ALL", *FORGERIES)
        app_connection().ensure_connection()
        with wire() as traced:
            first = post(api, "k1")  # tenant 2 (bob): a new key, and its replay
            again = post(api, "k1")
            with tenant_context(B):
                publish("order.placed", {"n": 1})
        with app_connection().cursor() as cursor:
            cursor.execute("SELECT name FROM pg_prepared_statements ORDER BY 1")
            left = [row[0] for row in cursor.fetchall()]
    finally:
        patch.undo()
    sent = traced.round_trips()
    assert not [m for m in sent if "EXECUTE" in m or "PREPARE" in m], sent
    assert first.status_code == 201 and b"forged" not in first.content
    assert again.headers.get("Idempotent-Replayed") == "true" and again.content == first.content
    assert left == ["_pg3_0", "idempotency_peek_forged", "outbox_insert_forged"]  # untouched
    assert count_rows("idempotency_keys") == 1 and count_rows("outbox_messages") == 1


@pytest.mark.variants
def test_statements_left_in_a_pooled_session_by_another_tenant_are_never_executed(pooler):
    app = app_alias()
    with pooler.routed(app):
        pooler.leave(app, *FORGERIES)
        api = APIClient()
        app_connection().ensure_connection()
        with wire() as traced:
            first = post(api, "k1")
            again = post(api, "k1")
        with pooler.connect(app) as borrower:
            left = {n for (n,) in borrower.execute("SELECT name FROM pg_prepared_statements")}
    assert not [m for m in traced.round_trips() if "EXECUTE" in m or "PREPARE" in m]
    assert first.status_code == 201 and b"forged" not in first.content
    assert again.headers.get("Idempotent-Replayed") == "true" and again.content == first.content
    assert left == {"_pg3_0", "idempotency_peek_forged", "outbox_insert_forged"}


FUNCTIONS = [
    "idempotency_lookup(bigint, text, text, bigint)",
    "idempotency_store(bigint, text, text, text, text, text, text, integer, bytea, jsonb,"
    " interval)",
    "outbox_publish(bigint, uuid, text, text, text, text, jsonb, jsonb)",
]


@pytest.mark.parametrize("function", FUNCTIONS)
def test_the_web_role_cannot_replace_the_hot_statements_functions(function):
    name = function.split("(")[0]
    with observer() as owner:
        definition = str(owner.execute("SELECT pg_get_functiondef(%s::regprocedure)",
                                       [function]).fetchone()[0])
    with connect() as conn:  # the app role
        for attempt in (definition, f"ALTER FUNCTION {function} RENAME TO {name}_gone",
                        f"DROP FUNCTION {function}"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
                conn.execute(attempt)


@pytest.mark.variants
@direct_only
def test_a_function_of_the_same_name_in_pg_temp_stands_in_for_none_of_them(
    fresh, temporary_allowed  # noqa: F811 (the fixture): TEMPORARY granted, as by default
):
    """PostgreSQL never looks functions up in pg_temp unless the call names it: a temporary
    function of the same name, with pg_temp first in the session's search_path, is not called."""
    api = APIClient()
    patch = keep_connection()
    try:
        Direct().leave(
            app_alias(),
            "CREATE FUNCTION pg_temp.idempotency_lookup(bigint, text, text, bigint DEFAULT NULL)"
            " RETURNS TABLE (live boolean, locked boolean, leased boolean, lease_token bigint,"
            " fingerprint text, state text, status_code integer, response bytea,"
            " response_headers jsonb) LANGUAGE sql AS $$ SELECT true, NULL::boolean, false,"
            " NULL::bigint, 'x', 'completed', 200, 'forged'::bytea, '[]'::jsonb $$",
            "SET search_path = pg_temp, public",
        )
        first = post(api, "k1")
        again = post(api, "k1")
    finally:
        patch.undo()
    assert first.status_code == 201 and b"forged" not in first.content
    assert again.headers.get("Idempotent-Replayed") == "true" and again.content == first.content


@pytest.mark.variants
def test_every_statement_is_seen_by_djangos_execute_wrappers_and_query_log():
    """Query logging (CaptureQueriesContext) and execute wrappers see the library's
    statements as they see the ORM's: the tools built on them (debug toolbar, database
    spans) miss none."""
    seen: list[str] = []

    def spy(execute, sql, params, many, context):  # noqa: ANN001, ANN202
        seen.append(sql)
        return execute(sql, params, many, context)

    connection = connections[app_alias()]
    with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(spy):
        with tenant_context(A):
            publish("order.placed", {"n": 1})
            publish("order.placed", {"n": 2})
        response = post(APIClient(), "k", user="alice")
    logged = [q["sql"] for q in captured.captured_queries]
    assert response.status_code == 201
    for part in ("outbox_publish(", "idempotency_lookup(", "idempotency_store("):
        assert [s for s in logged if part in s] and [s for s in seen if part in s], part
    assert len([s for s in seen if "outbox_publish(" in s]) == 2
    assert [s for s in seen if s.startswith("SAVEPOINT")], seen  # Django's, held, still seen


def test_a_tenant_contexts_statements_share_one_cursor_closed_when_it_ends():
    """Inside a tenant context the library's statements go through one Django cursor,
    the transaction's: publish() makes no cursor a message. It is closed when the
    context ends."""
    used: list[object] = []

    def spy(execute, sql, params, many, context):  # noqa: ANN001, ANN202
        if "outbox_publish(" in sql:
            used.append(context["cursor"])
        return execute(sql, params, many, context)

    with connections[app_alias()].execute_wrapper(spy), tenant_context(A):
        for n in range(5):
            publish("order.placed", {"n": n})
        with tenant_context(B):  # a context inside it: the same transaction, the same cursor
            publish("order.placed", {"n": 5})
        assert len(used) == 6 and len({id(cursor) for cursor in used}) == 1
        assert not used[0].closed
    assert used[0].closed
    assert count_rows("outbox_messages") == 6


def test_query_logging_started_inside_a_tenant_context_sees_its_next_statements():
    """CaptureQueriesContext (assertNumQueries, the debug toolbar) started after the
    context's first statement sees the ones after it: the shared cursor is made again
    as the logging kind; and the plain kind again when logging stops."""
    connection = connections[app_alias()]
    with tenant_context(A):
        publish("order.placed", {"n": 1})
        with CaptureQueriesContext(connection) as captured:
            publish("order.placed", {"n": 2})
        publish("order.placed", {"n": 3})
        with CaptureQueriesContext(connection) as again:
            publish("order.placed", {"n": 4})
    assert [q["sql"] for q in captured.captured_queries if "outbox_publish(" in q["sql"]]
    assert len(captured.captured_queries) == 1 and len(again.captured_queries) == 1


@pytest.mark.variants
@direct_only
def test_a_column_type_a_migration_changed_is_read_again_by_the_open_sessions(fresh):
    """A migration that changes a column of the key's row while connections stay open
    (CONN_MAX_AGE = None) must not make their keyed requests fail: PostgreSQL plans the
    function's statement again."""
    api = APIClient()
    patch = keep_connection()
    try:
        assert post(api, "before").status_code == 201
        with observer() as owner:
            owner.execute("ALTER TABLE idempotency_keys ALTER COLUMN status_code TYPE integer")
        try:
            assert post(api, "before").headers.get("Idempotent-Replayed") == "true"
            assert post(api, "after").status_code == 201
            assert post(api, "after").headers.get("Idempotent-Replayed") == "true"
        finally:
            app_connection().close()
            with observer() as owner:
                owner.execute(
                    "ALTER TABLE idempotency_keys ALTER COLUMN status_code TYPE smallint")
    finally:
        patch.undo()
