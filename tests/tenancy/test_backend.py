"""The library's database backend: statements that return nothing travel with the next one.

tenancy.backends.postgresql holds ``BEGIN``, ``SAVEPOINT``, ``RELEASE SAVEPOINT``
and the statements given to ``hold()`` while a block runs under ``holding()``,
and sends them at the head of the next statement's message, through the
methods Django calls on a backend (``_start_transaction_under_autocommit``,
``_savepoint`` and the others) and psycopg's ``cursor_factory``. These tests
hold it to doing exactly what Django's backend does, one message at a time,
on the oldest and newest Django the library allows (tox.ini runs this file).
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import DatabaseError, close_old_connections, connections, transaction
from django.test.utils import CaptureQueriesContext

from tenancy import tenant_context
from tenancy.aliases import app_alias
from tenancy.context import holding
from tests.helpers import app_connection, count_rows
from tests.pooler import connection_settings
from tests.testapp.models import Order
from tests.wire import wire

pytestmark = pytest.mark.variants  # make test-variants runs it again (docs/contributing.md)

A = 1


class Abort(Exception):
    pass


def held_nothing() -> bool:
    held = app_connection().held
    return held.statements == [] and held.unsent == {} and not held.begins


def rows() -> int:
    return count_rows("testapp_order")


def ready() -> None:
    """The app alias connected, and checked (CONN_HEALTH_CHECKS) as a request's first use would."""
    with app_connection().cursor() as cursor:
        cursor.execute("SELECT 1")


def test_a_transaction_begun_while_holding_sends_begin_with_its_first_statement():
    ready()
    with wire() as traced, holding(app_alias()), transaction.atomic(using=app_alias()):
        with app_connection().cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
    assert traced.round_trips() == ["BEGIN; SELECT 1", "COMMIT"]
    assert held_nothing() and app_connection().get_autocommit()


def test_without_holding_django_and_psycopg_send_begin_as_they_always_did():
    ready()
    with wire() as traced, transaction.atomic(using=app_alias()):
        with app_connection().cursor() as cursor:
            cursor.execute("SELECT 1")
    assert traced.round_trips() == ["BEGIN", "SELECT 1", "COMMIT"]


def test_a_savepoint_is_sent_with_the_first_statement_inside_it_and_rolls_back_as_usual():
    with tenant_context(A), holding(app_alias()):
        Order.objects.create(tenant_id=A, sku="kept")
        with wire() as traced:
            with pytest.raises(Abort), transaction.atomic(using=app_alias()):
                Order.objects.create(tenant_id=A, sku="undone")
                raise Abort
        first, rollback = traced.round_trips()[:2]
        assert first.startswith('SAVEPOINT "') and "INSERT INTO" in first, first
        assert rollback.startswith('ROLLBACK TO SAVEPOINT "'), rollback
    with tenant_context(A):
        assert list(Order.objects.values_list("sku", flat=True)) == ["kept"]


def test_a_savepoint_nothing_was_sent_in_is_never_sent():
    ready()
    with wire() as traced, holding(app_alias()), transaction.atomic(using=app_alias()):
        with app_connection().cursor() as cursor:
            cursor.execute("SELECT 1")
        with transaction.atomic(using=app_alias()):  # released unsent
            pass
        with pytest.raises(Abort), transaction.atomic(using=app_alias()):  # rolled back unsent
            with transaction.atomic(using=app_alias()):
                pass
            raise Abort
        with app_connection().cursor() as cursor:
            cursor.execute("SELECT 2")
    assert traced.round_trips() == ["BEGIN; SELECT 1", "SELECT 2", "COMMIT"]
    assert held_nothing()


def test_execute_wrappers_and_the_query_log_see_each_statement_once_as_it_was_given():
    seen: list[str] = []

    def spy(execute, sql, params, many, context):  # noqa: ANN001, ANN202
        seen.append(sql)
        return execute(sql, params, many, context)

    connection = app_connection()
    with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(spy):
        with tenant_context(A), holding(app_alias()), transaction.atomic(using=app_alias()):
            Order.objects.create(tenant_id=A, sku="tea")
    logged = [q["sql"] for q in captured.captured_queries]
    assert None not in logged, logged
    savepoints = [s for s in logged if s.startswith("SAVEPOINT")]
    inserts = [s for s in logged if s.startswith("INSERT")]
    assert len(savepoints) == 1 and len(inserts) == 1, logged
    assert inserts[0].startswith('INSERT INTO "testapp_order"'), inserts  # not the whole message
    assert [s for s in seen if s.startswith("SAVEPOINT")] == savepoints


def test_a_message_postgresql_cannot_parse_leaves_the_transaction_django_believes_in():
    """Nothing of an unparsable message runs, the held BEGIN included: it is sent again, so
    that the statements after the error are in the transaction, as Django believes."""
    ready()
    with holding(app_alias()), transaction.atomic(using=app_alias()):
        with app_connection().cursor() as cursor:
            with pytest.raises(DatabaseError):
                cursor.execute("SELEC 1")  # the transaction's first statement
            status = app_connection().connection.info.transaction_status
            assert status is psycopg.pq.TransactionStatus.INTRANS
            # Two statements, one transaction (in autocommit each would have its own).
            cursor.execute("SELECT pg_current_xact_id()::text")
            first = cursor.fetchone()
            cursor.execute("SELECT pg_current_xact_id()::text")
            assert cursor.fetchone() == first


def test_copy_sends_what_is_held_before_it():
    # The transaction's first statement: now() is the transaction's start, so the COPY saw
    # the same now() as a later statement only if it ran inside the transaction.
    with holding(app_alias()), transaction.atomic(using=app_alias()):
        with app_connection().cursor() as cursor:
            with cursor.copy("COPY (SELECT now()::text) TO STDOUT") as copy:
                copied = b"".join(bytes(data) for data in copy).decode().strip()
            cursor.execute("SELECT now()::text")
            assert cursor.fetchone()[0] == copied


def test_executemany_sends_what_is_held_before_it():
    with pytest.raises(Abort), holding(app_alias()), tenant_context(A):
        with app_connection().cursor() as cursor:
            cursor.executemany("INSERT INTO testapp_order (tenant_id, sku, quantity, note)"
                               " VALUES (%s, %s, 1, '')", [(A, "one"), (A, "two")])
        assert rows() == 0  # not committed on their own
        raise Abort
    assert rows() == 0


@pytest.mark.direct_sessions("default", reason="declares a server-side cursor")
def test_a_server_side_cursor_sends_what_is_held_first():
    with tenant_context(A):
        Order.objects.create(tenant_id=A, sku="tea")
    with holding(app_alias()), tenant_context(A):
        assert [o.sku for o in Order.objects.all().iterator(chunk_size=10)] == ["tea"]
    assert held_nothing()


def test_nothing_is_held_after_a_commit_or_a_rollback():
    with holding(app_alias()), transaction.atomic(using=app_alias()):
        app_connection().hold("SELECT 1")
    assert held_nothing()
    with pytest.raises(Abort), holding(app_alias()), transaction.atomic(using=app_alias()):
        with transaction.atomic(using=app_alias()):
            app_connection().hold("SELECT 1")
            raise Abort
    assert held_nothing()
    with app_connection().cursor() as cursor:
        cursor.execute("SELECT 3")
        assert cursor.fetchone() == (3,)


@pytest.mark.parametrize("options", [
    {"isolation_level": psycopg.IsolationLevel.REPEATABLE_READ},
    {"isolation_level": psycopg.IsolationLevel.SERIALIZABLE},
], ids=["repeatable-read", "serializable"])
def test_the_held_begin_carries_the_aliass_isolation_level(options):
    settings_dict = app_connection().settings_dict
    with connection_settings(app_alias(), OPTIONS={**settings_dict.get("OPTIONS", {}), **options}):
        app_connection().ensure_connection()
        with wire() as traced, holding(app_alias()), transaction.atomic(using=app_alias()):
            with app_connection().cursor() as cursor:
                cursor.execute("SHOW transaction_isolation")
                level = cursor.fetchone()[0]
    name = options["isolation_level"].name.replace("_", " ")
    assert level == name.lower()
    assert traced.round_trips()[0] == f"BEGIN ISOLATION LEVEL {name}; SHOW transaction_isolation"


def test_a_connection_lost_under_held_statements_leaves_nothing_held_for_the_next():
    ready()
    with pytest.raises(DatabaseError), holding(app_alias()), transaction.atomic(using=app_alias()):
        with app_connection().cursor() as cursor:  # the server session ends under BEGIN
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    connections[app_alias()].close()
    with holding(app_alias()), transaction.atomic(using=app_alias()):
        with app_connection().cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
    assert held_nothing()


def test_what_is_held_goes_with_the_next_statement_even_after_a_health_check():
    """With CONN_HEALTH_CHECKS, the first cursor of a request first checks the connection
    with a query of its own: it must not carry what was held for the statement after it."""
    with connection_settings(app_alias(), CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=True):
        app_connection().ensure_connection()
        close_old_connections()  # a new request: the connection is checked on its next use
        app_connection().prefix("SET LOCAL app.tenant_id = '7'")
        with app_connection().cursor() as cursor:
            cursor.execute("SELECT current_setting('app.tenant_id', true)")
            assert cursor.fetchone() == ("7",)
