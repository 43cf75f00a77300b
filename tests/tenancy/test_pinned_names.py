"""Names resolve to the migrations' schema, whatever an earlier borrower left in the session.

A server session outlives the request that used it: Django keeps it with
``CONN_MAX_AGE``, pgbouncer lends it to the next client in transaction mode.
An earlier borrower (a bug, or SQL injected into another tenant's request)
may leave a temporary table named like a library table in it, and a
temporary schema is searched *first* for tables unless ``search_path`` says
otherwise; or it may leave a session-level ``search_path``. Every statement
the library sends for a tenant (the key's read and claim, the replay, the
stored answer, ``publish()``, the ORM inside ``tenant_context()``, a
consumer's batch) pins its names (``tenancy.context.search_path_sql``), so
none of that reaches the temporary table.

Each test runs twice: on one persistent Django connection (the earlier
borrower ran on the same connection), and through a private pgbouncer whose
pools hold one server session (the earlier borrower was another client of
it). The roles are given ``TEMPORARY`` for the test, as PostgreSQL's default
grants it to everyone (``migrate`` takes it away: tests/tenancy/test_temporary.py).
``make test-verified`` runs them in the verified tenant context.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connections
from rest_framework.test import APIClient

from outbox import publish
from outbox.consumers import ensure_offsets, run_batch
from tenancy import tenant_context
from tenancy.aliases import app_alias, worker_alias
from tests.helpers import count_rows, superuser
from tests.outbox.support.helpers import effects, message_position, offset, publish_many
from tests.outbox.support.recorders import OrderRecorder
from tests.testapp.models import Order

pytestmark = pytest.mark.variants  # make test-variants runs it again (docs/contributing.md)

B = 2  # bob's tenant (tests/testapp/auth.py); the earlier borrower had none

#: What an earlier borrower leaves besides its temporary tables.
SEARCH_PATHS = {
    "default": [],
    "pg_temp first": ["SET search_path = pg_temp, public"],
    "empty": ["SET search_path = ''"],
}


def shadow(table: str) -> str:
    return f"CREATE TEMP TABLE {table} (LIKE public.{table} INCLUDING ALL)"


@pytest.fixture
def temporary_allowed() -> Iterator[None]:
    """The app and worker roles may create temporary tables, as PUBLIC may by default."""
    database = settings.DATABASES["owner"]["NAME"]
    roles = [settings.DATABASES[a]["USER"] for a in (app_alias(), worker_alias())]
    with superuser() as conn:
        for role in roles:
            conn.execute(f'GRANT TEMPORARY ON DATABASE "{database}" TO {role}')
    yield
    with superuser() as conn:
        for role in roles:
            conn.execute(f'REVOKE TEMPORARY ON DATABASE "{database}" FROM {role}')


class Direct:
    """The earlier borrower ran on the very connection Django goes on using.

    A direct session to PostgreSQL, kept across requests (``CONN_MAX_AGE``),
    even when ``DIO_POOLED`` puts the alias behind pgbouncer: what it holds
    ends with it.
    """

    name = "direct"

    def leave(self, alias: str, *sql: str) -> None:
        with connections[alias].cursor() as cursor:
            for statement in sql:
                cursor.execute(statement)

    @contextlib.contextmanager
    def routed(self, *aliases: str) -> Iterator[None]:
        direct = settings.DATABASES["owner"]  # never pooled
        saved = {}
        for alias in aliases:
            connection = connections[alias]
            connection.close()
            saved[alias] = {key: connection.settings_dict[key]
                            for key in ("CONN_MAX_AGE", "HOST", "PORT")}
            connection.settings_dict.update(CONN_MAX_AGE=None, HOST=direct["HOST"],
                                            PORT=direct["PORT"])
        try:
            yield
        finally:
            for alias, values in saved.items():
                connections[alias].close()
                connections[alias].settings_dict.update(values)


@pytest.fixture(params=["direct", "pgbouncer"])
def route(request, temporary_allowed):
    if request.param == "direct":
        return Direct()
    return request.getfixturevalue("bare_pooler")  # no reset: the pins stand alone


def session(alias: str, sql: str):
    """One row from the server session Django's ``alias`` is on (autocommit)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()


def post(api: APIClient, key: str):
    return api.post("/published-orders/", {"sku": "tea"}, format="json",
                    headers={"X-User": "bob", "Idempotency-Key": key})


@pytest.mark.parametrize("search_path", SEARCH_PATHS)
def test_a_temporary_table_named_like_a_library_table_captures_nothing(route, search_path):
    app = app_alias()
    with route.routed(app):
        pid = session(app, "SELECT pg_backend_pid()")[0]
        route.leave(
            app,
            shadow("idempotency_keys"), shadow("outbox_messages"), shadow("testapp_order"),
            # a stored answer for a key bob is about to send, and an order of his
            "INSERT INTO pg_temp.idempotency_keys (tenant_id, scope, key, request_hash,"
            " request_method, request_path, state, status_code, response, response_headers,"
            " expires_at) VALUES (2, 'order.create-published', 'planted', 'x', 'POST', '/',"
            " 'completed', 201, '{\"planted\": true}', '[]', now() + interval '1 day')",
            "INSERT INTO pg_temp.testapp_order (tenant_id, sku, quantity, note)"
            " VALUES (2, 'planted', 1, '')",
            *SEARCH_PATHS[search_path],
        )
        api = APIClient()
        first = post(api, "k1")
        replay = post(api, "k1")
        planted = post(api, "planted")
        with tenant_context(B):
            skus = sorted(Order.objects.values_list("sku", flat=True))
            publish("pinned.checked", {"by": "orm"})
        # The earlier borrower's tables are still there, in the same server
        # session, and nothing went into them.
        assert session(app, "SELECT pg_backend_pid()")[0] == pid
        assert session(app, "SELECT (SELECT count(*) FROM pg_temp.idempotency_keys),"
                            " (SELECT count(*) FROM pg_temp.outbox_messages),"
                            " (SELECT count(*) FROM pg_temp.testapp_order)") == (1, 0, 1)
    assert first.status_code == 201, first.content
    assert replay.status_code == 201 and replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.content == first.content
    assert planted.status_code == 201 and "Idempotent-Replayed" not in planted.headers
    assert b"planted" not in planted.content
    assert skus == ["tea", "tea"]
    assert count_rows("idempotency_keys", "tenant_id = 2") == 2
    assert count_rows("testapp_order", "tenant_id = 2") == 2
    assert count_rows("outbox_messages", "tenant_id = 2 AND topic = 'order.placed'") == 2
    assert count_rows("outbox_messages", "tenant_id = 2 AND topic = 'pinned.checked'") == 1


@pytest.mark.parametrize("search_path", SEARCH_PATHS)
def test_a_consumer_batch_locks_and_advances_its_own_offset_row(route, search_path):
    worker = worker_alias()
    consumer = OrderRecorder()
    ids = publish_many(B, "order.placed", [{"sku": "tea"}, {"sku": "cake"}])
    ensure_offsets(consumer)
    with route.routed(worker):
        route.leave(
            worker,
            shadow("consumer_offsets"),
            # a position past everything: a batch that read it would skip the messages
            "INSERT INTO pg_temp.consumer_offsets (name, partition, partition_count, last_id,"
            " attempts) VALUES ('orders', 0, 1, 1000000, 0)",
            *SEARCH_PATHS[search_path],
        )
        result = run_batch(consumer)
        assert session(worker, "SELECT last_id FROM pg_temp.consumer_offsets") == (1000000,)
    assert result.handled == 2
    assert effects() == {str(i): 1 for i in ids}
    assert offset("orders")[0] == message_position(ids[-1])


def test_the_pinned_path_is_the_one_sessions_start_with_not_what_they_were_set_to():
    from tenancy.context import _schemas, search_path_sql

    app = app_alias()
    with Direct().routed(app):
        Direct().leave(app, "SET search_path = pg_temp, pg_catalog")
        _schemas.clear()  # derived again, on this session
        assert search_path_sql(app) == 'SET LOCAL search_path = "public", pg_temp'
