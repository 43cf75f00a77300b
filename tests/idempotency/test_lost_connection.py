"""docs/mixin.md: a crash anywhere rolls everything back, a lost database connection included.

The request's app-role session is cut (``pg_terminate_backend``, as a server restart or
a network fault would) at each point of a keyed request: before the handler's first
statement, after the handler wrote, and inside the final store and COMMIT. Each time
the client gets a 5xx, nothing of the request is left (no order, no key, no event), the
retry runs the handler once, and the next retry replays it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connections

from tests.helpers import count_rows, observer, wait_for
from tests.idempotency.conftest import Client

pytestmark = pytest.mark.variants  # make test-variants runs it again (docs/contributing.md)

PATH = "/orders-holding/"


def nothing_left() -> bool:
    return all(count_rows(table) == 0
               for table in ("testapp_order", "idempotency_keys", "outbox_messages"))


@contextmanager
def request_in_a_thread(**data) -> Iterator[dict]:
    """POST a keyed order in a thread of its own; its answer in ``answers["first"]``."""
    answers: dict = {}

    def run() -> None:
        client = Client()
        client.raise_request_exception = False
        try:
            answers["first"] = client.order(key="cut", path=PATH, data=data)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield answers
    finally:
        thread.join(60)
    assert not thread.is_alive()


def cut(where: str) -> None:
    """Terminate the one app-role session of the test database that matches ``where``."""
    with observer() as conn:
        cut = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = current_database() AND usename = %s AND {where}",
            [app_role()],
        ).fetchall()
    assert cut == [(True,)], cut


def app_role() -> str:
    from tests.helpers import app_role as role

    return role()


def in_transaction(where: str) -> bool:
    with observer() as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            f" AND usename = %s AND {where}", [app_role()],
        ).fetchone()[0] == 1


def assert_the_retry_runs_once() -> None:
    client = Client()
    retry = client.order(key="cut", path=PATH)
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry
    again = client.order(key="cut", path=PATH)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert count_rows("testapp_order") == 1 and count_rows("idempotency_keys") == 1


@pytest.mark.parametrize("at, session", [
    ("start", "state = 'idle in transaction'"),  # the key's transaction, open: nothing written
    ("written", "state = 'idle in transaction' AND backend_xid IS NOT NULL"),  # the order
], ids=["before-the-handlers-first-statement", "after-the-handler-wrote"])
def test_a_connection_lost_in_the_handler_leaves_nothing_and_the_retry_runs_once(
        tmp_path, at, session):
    gate = tmp_path / "hold"
    gate.touch()
    with request_in_a_thread(sku="tea", quantity=1, hold=str(gate), hold_at=at) as answers:
        wait_for((tmp_path / "hold.held").exists, "the request to reach its handler")
        wait_for(lambda: in_transaction(session), "the request's transaction")
        cut(session)
        gate.unlink()  # the handler goes on, on a connection that is gone
    assert answers["first"].status_code >= 500
    assert nothing_left()
    assert_the_retry_runs_once()


@pytest.fixture
def storing_the_key_waits_on_lock_4242():
    """A deferred constraint trigger on idempotency_keys: storing key 'cut' makes its
    transaction's COMMIT wait for advisory lock 4242 (the test holds it)."""
    with observer() as conn:
        conn.execute(
            "CREATE FUNCTION tests_wait_at_commit() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$")
        conn.execute(
            "CREATE CONSTRAINT TRIGGER tests_key_waits_at_commit AFTER INSERT ON"
            " idempotency_keys DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
            " WHEN (NEW.key = 'cut') EXECUTE FUNCTION tests_wait_at_commit()")
    try:
        yield
    finally:
        with observer() as conn:
            conn.execute("DROP TRIGGER tests_key_waits_at_commit ON idempotency_keys")
            conn.execute("DROP FUNCTION tests_wait_at_commit()")


def test_a_connection_lost_in_the_final_store_and_commit_leaves_nothing(
        storing_the_key_waits_on_lock_4242):
    """The key's row and the order commit together: cut while the COMMIT that stores the key
    waits, and neither is there (a store committed apart from the handler's writes would
    leave the order without its key, and the retry would make a second one)."""
    with observer() as holder:
        holder.execute("SELECT pg_advisory_lock(4242)")
        with request_in_a_thread(sku="tea", quantity=1) as answers:
            wait_for(lambda: in_transaction("wait_event = 'advisory'"),
                     "the COMMIT to wait in the trigger")
            cut("wait_event = 'advisory'")
            holder.execute("SELECT pg_advisory_unlock(4242)")
    assert answers["first"].status_code >= 500
    assert nothing_left()  # the COMMIT never completed: no key, no order
    assert_the_retry_runs_once()
