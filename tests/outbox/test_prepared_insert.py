"""publish()'s INSERT is prepared where a server session is the connection's own, never pooled.

``outbox.store.insert_message`` sends its INSERT through the cursor the
library keeps per connection (``tenancy.statements``):
prepared by the first message that sends it on a connection of an alias
that is not pooled, ``EXECUTE`` from then on; as text through a pooler. And
whatever it sends still passes through Django's cursor wrapping, so that
``CaptureQueriesContext``, query logging and execute wrappers see it.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from outbox import publish, store
from tenancy import tenant_context
from tenancy.aliases import app_alias
from tests.helpers import app_connection, count_rows
from tests.idempotency.test_upstream import wire

A = 1
NAME = store._INSERT_STATEMENT.name

direct_only = pytest.mark.direct_sessions(
    "default", reason="prepares only where the app alias has server sessions of its own"
)


def prepared_here() -> list[str]:
    with app_connection().cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'outbox\\_%'")
        return [row[0] for row in cursor.fetchall()]


def publish_some(count: int, topic: str = "order.placed") -> None:
    with tenant_context(A):
        for n in range(count):
            publish(topic, {"n": n})


def inserts(sent: list[str]) -> list[str]:
    return [m for m in sent if "outbox_messages" in m or NAME in m]


@direct_only
def test_the_first_insert_of_a_connection_prepares_it_in_its_own_message(fresh):
    app_connection().ensure_connection()
    with wire() as traced:
        publish_some(3)
    first, second, third = inserts(traced.round_trips())
    assert first.startswith(f"PREPARE {NAME} (bigint, uuid, text, text, text, text, text, text)"
                            " AS INSERT INTO outbox_messages"), first
    assert f"; EXECUTE {NAME}(1, " in first
    assert second.startswith(f"EXECUTE {NAME}(1, ") and third.startswith(f"EXECUTE {NAME}(1, ")
    assert prepared_here() == [NAME]
    assert count_rows("outbox_messages") == 3


@direct_only
def test_after_a_failed_first_insert_the_connection_sends_it_as_text(fresh):
    def broken(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith("PREPARE"):
            sql = sql.replace(f"EXECUTE {NAME}(", "SELECT nowhere(")
        return execute(sql, params, many, context)

    app_connection().ensure_connection()
    with app_connection().execute_wrapper(broken), pytest.raises(Exception, match="nowhere"):
        publish_some(1)
    assert prepared_here() == [NAME]  # its PREPARE ran, which the error did not tell
    with wire() as traced:
        publish_some(2)
    sent = inserts(traced.round_trips())
    assert len(sent) == 2 and all(m.lstrip().startswith("INSERT INTO") for m in sent), sent
    assert count_rows("outbox_messages") == 2


@direct_only
def test_an_insert_deallocated_by_someone_fails_once_then_is_prepared_again(fresh):
    publish_some(1)
    with app_connection().cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with pytest.raises(Exception, match="does not exist"):  # that transaction rolls back
        publish_some(1)
    with wire() as traced:
        publish_some(2)
    first, second = inserts(traced.round_trips())
    assert first.startswith(f"PREPARE {NAME} ") and second.startswith(f"EXECUTE {NAME}(")
    assert count_rows("outbox_messages") == 3


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "undeclared"])
def test_a_pooled_alias_never_prepares_the_insert(pooler, declared):
    with pooler.through(app_alias(), declared=declared):
        app_connection().ensure_connection()
        with wire() as traced:
            publish_some(3)
        with pooler.connect() as borrower:
            left = borrower.execute("SELECT name FROM pg_prepared_statements").fetchall()
    sent = inserts(traced.round_trips())
    assert left == []
    assert len(sent) == 3 and all(m.lstrip().startswith("INSERT INTO") for m in sent), sent
    assert count_rows("outbox_messages") == 3


def test_the_kept_cursor_is_wrapped_by_django_as_a_new_one_would_be():
    """Query logging (CaptureQueriesContext) and execute wrappers see every statement."""
    seen: list[str] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    connection = connections[app_alias()]
    with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(spy):
        publish_some(2)
    logged = [q["sql"] for q in captured.captured_queries if "outbox_" in q["sql"]]
    assert len(logged) == 2 and len([s for s in seen if "outbox_" in s]) == 2, (logged, seen)
    assert count_rows("outbox_messages") == 2
