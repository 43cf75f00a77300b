"""Nothing crosses from one borrower of a server session to the next.

pgbouncer in transaction mode lends a server session for one transaction,
then to whoever comes next: another tenant's request, possibly. Each test
here leaves one kind of session state in the single server session of a
private pgbouncer whose pools hold one (``tests/pooler.py``), as tenant 1's
request (a bug of its own or SQL injected into it) could, then runs the
library's flows for tenant 2 on that same session: a keyed request and its
replay, ``publish()``, a receiver, a consumer batch, a relay round, the key
reaper and the completer. Their effects must be tenant 2's, complete and in
the real tables. docs/roles.md ("What a server session carries") states the
result per kind; temporary tables and a session ``search_path`` are tested
in tests/tenancy/test_pinned_names.py and tests/tenancy/test_temporary.py.

The last two tests run the same flows and then read the sessions they used
(tests/session_state.py): directly, on persistent Django connections, and
through the pooler, the library leaves nothing in a session.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from django.conf import settings
from rest_framework.test import APIClient

from idempotency.completer import complete_abandoned_keys
from idempotency.core import IdempotentRequest
from idempotency.reaper import reap_expired_keys
from outbox import publish
from outbox.consumers import ensure_offsets, run_batch
from outbox.receivers import receive
from outbox.relay import Relay
from outbox.stream import Message
from outbox.testing import InMemoryTransport
from tenancy import current_tenant_id, tenant_context
from tenancy.aliases import app_alias, worker_alias
from tenancy.conf import tenancy_settings
from tests.helpers import app_atomic, count_rows, observer, set_tenant
from tests.outbox.support.recorders import OrderRecorder
from tests.pooler import Pooler
from tests.session_state import (
    django_state,
    no_session_state_left,
    read_state,
)
from tests.tenancy.test_pinned_names import Direct
from tests.testapp.models import Order

# make test-variants runs the tests marked `variants` again: those that send a statement
# through the library's aliases, which a deployment variant can change (docs/contributing.md).

A, B = 1, 2  # alice's tenant left the state; bob's request comes next
SCOPE = "order.create-published"


def aliases() -> dict[str, str]:
    return {"app": app_alias(), "worker": worker_alias(),
            "system": tenancy_settings.SYSTEM_DATABASE}


@pytest.fixture
def alices_order() -> int:
    with tenant_context(A):
        return Order.objects.create(tenant_id=A, sku="alice's", quantity=1, note="").pk


def lock_id(key: str) -> int:
    return IdempotentRequest(B, SCOPE, key, fingerprint="").lock_id


def post(api: APIClient, key: str):
    return api.post("/published-orders/", {"sku": "tea"}, format="json",
                    headers={"X-User": "bob", "Idempotency-Key": key})


def the_librarys_flows_for_tenant_2() -> None:
    """Every flow of the library once, for tenant 2, each checked by its effect."""
    api = APIClient()
    first, replay = post(api, "k1"), post(api, "k1")
    assert first.status_code == 201, first.content
    assert replay.status_code == 201 and replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.content == first.content
    assert post(api, "old").status_code == 201
    with tenant_context(B):
        assert sorted(Order.objects.values_list("sku", flat=True)) == ["tea", "tea"]
        published = publish("session.checked", {"n": 1})
    envelope = Message(1, published, B, "session.checked", {"n": 1}).envelope()
    ran, tenant = receive(envelope, lambda m: current_tenant_id(), receiver="session.test")
    assert ran and tenant == B
    consumer = OrderRecorder()
    ensure_offsets(consumer)
    assert run_batch(consumer).handled == 2  # the two order.placed of the requests
    memory = InMemoryTransport()
    relay = Relay(memory, name="session-state")
    try:
        relay.drain()
    finally:
        relay.release()
    assert len(memory.sent) == 3
    with observer() as conn:
        conn.execute("UPDATE idempotency_keys SET expires_at = now() - interval '1 minute'"
                     " WHERE key = 'old'")
    assert reap_expired_keys().deleted == 1
    assert complete_abandoned_keys(older_than=0).found == 0
    # Everything landed in the real tables, as tenant 2.
    assert count_rows("idempotency_keys", "tenant_id = 2") == 1  # k1; the reaper took old
    assert count_rows("outbox_messages", "tenant_id = 2") == 3
    assert count_rows("outbox_received", "tenant_id = 2") == 1
    assert count_rows("testapp_order", "tenant_id = 2") == 4  # two requests, two handled
    assert count_rows("testapp_order", "tenant_id = 1") == 1


def server_pid(pooler: Pooler, alias: str) -> int:
    with pooler.connect(alias) as conn:
        return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


@pytest.mark.variants
def test_session_advisory_locks_left_behind_hold_nothing_back(pooler, alices_order):
    # Advisory locks are the database's, not a role's: each session takes its own.
    for n, alias in enumerate(aliases().values()):
        first = 1000 * n
        pooler.leave(
            alias,
            f"SELECT pg_advisory_lock(k) FROM generate_series({first}, {first + 99}) AS k",
            f"SELECT pg_advisory_lock_shared(k, k) FROM generate_series({first}, {first + 99})"
            " AS k",
        )
    # ...and the app's: the very keys bob sends (the second one the reaper deletes later).
    pooler.leave(app_alias(), f"SELECT pg_advisory_lock({lock_id('k1')})",
                 f"SELECT pg_advisory_lock_shared({lock_id('old')})")
    pids = {alias: server_pid(pooler, alias) for alias in aliases().values()}
    with pooler.routed(*aliases().values()):
        the_librarys_flows_for_tenant_2()
    with observer() as conn:  # still held by the same sessions, all along
        held = [conn.execute("SELECT count(*) FROM pg_locks WHERE pid = %s"
                             " AND locktype = 'advisory'", [pid]).fetchone()[0]
                for pid in pids.values()]
    assert held == [202, 200, 200]


#: What one borrower's SQL may SET at session level (docs/scaling.md): each would make
#: every later request on that server session fail, or run as tenant 1, or weaken it.
LEFT_SETTINGS = [
    "SET default_transaction_read_only = on",
    "SET row_security = off",
    "SET search_path = pg_catalog",
    "SET statement_timeout = 1",
    "SET lock_timeout = 0",
    "SET idle_in_transaction_session_timeout = 0",
    "SET synchronous_commit = off",
    "SET default_transaction_isolation = 'serializable'",
]


@pytest.mark.variants
def test_session_settings_left_behind_change_nothing_for_the_next_tenant(pooler, alices_order):
    """pgbouncer resets what a borrower SET before the next one borrows the session
    (server_reset_query, docs/scaling.md): the next tenant's requests, the library's
    flows and code outside any tenant context see none of it."""
    app = app_alias()
    token = ""
    if tenancy_settings.VERIFIED_CONTEXT is not None:
        # a genuine token of tenant 1, minted for the borrower's own transaction
        with pooler.connect(app, autocommit=False) as conn:
            set_tenant(conn, A)
            token = conn.execute("SELECT current_setting('app.tenant_token')").fetchone()[0]
            conn.rollback()
    for alias in aliases().values():
        pooler.leave(
            alias,
            f"SET app.tenant_id = '{A}'",
            f"SET app.tenant_token = '{token}'",
            f"SET ROLE {settings.DATABASES[alias]['USER']}",  # the only role within reach
            *LEFT_SETTINGS,
        )
    # No other role is within reach: the app and worker roles belong to none.
    with pooler.connect(app) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(f"SET ROLE {settings.DATABASES[worker_alias()]['USER']}")
    with pooler.routed(*aliases().values()):
        with pooler.connect(app) as conn:  # the one session, reset
            assert conn.execute(
                "SELECT count(*) FROM pg_settings WHERE source = 'session'"
                " AND name NOT IN ('application_name', 'client_encoding', 'DateStyle',"
                " 'TimeZone', 'standard_conforming_strings', 'IntervalStyle')"
            ).fetchone() == (0,)
            assert conn.execute(
                "SELECT current_setting('app.tenant_id', true)").fetchone()[0] in (None, "")
        the_librarys_flows_for_tenant_2()
        api = APIClient()
        created = api.post("/orders/", {"sku": "tea"}, format="json",
                           headers={"X-User": "bob", "Idempotency-Key": "after-the-settings"})
        with app_atomic():
            outside_any_context = Order.objects.count()
    assert created.status_code == 201, created.content
    assert outside_any_context == 0  # no tenant left in the session, in either mode


@pytest.mark.variants
def test_an_empty_search_path_left_in_a_worker_session_stops_no_consumer_or_relay(
    bare_pooler, alices_order
):
    pooler = bare_pooler
    """A worker-role borrower (a consumer handler's SQL, say) empties its session's
    search_path: the library's own statements on the worker alias name their schema
    themselves (pinned), so the next borrower's batches, relay rounds and leases work."""
    worker = worker_alias()
    pooler.leave(worker, "SET search_path = ''")
    with pooler.routed(worker):
        with pooler.connect(worker) as conn:  # the setting is there, in the one session
            assert conn.execute("SHOW search_path").fetchone() == ('""',)
        with tenant_context(B):
            publish("order.placed", {"sku": "after"})
        consumer = OrderRecorder()
        ensure_offsets(consumer)
        assert run_batch(consumer).handled == 1
        memory = InMemoryTransport()
        relay = Relay(memory, name="empty-path")
        try:
            relay.drain()
        finally:
            relay.release()
        assert len(memory.sent) == 1
    with observer() as conn:
        assert conn.execute("SELECT lease_owner FROM consumer_offsets"
                            " WHERE name = 'relay:empty-path'").fetchone() == ("",)


@pytest.mark.variants
def test_prepared_statements_left_behind_are_never_run(pooler, alices_order):
    app = app_alias()
    pooler.leave(
        app,
        # the names psycopg gives the statements it prepares, and a look-alike of the
        # library's key lookup
        "PREPARE _pg3_0 AS SELECT 1",
        "PREPARE _pg3_1 AS SELECT 2",
        "PREPARE lookup(bigint) AS SELECT * FROM idempotency_keys WHERE tenant_id = $1",
    )
    with pooler.connect(app) as conn:  # and one prepared on the protocol level
        conn.execute("SELECT %s::int", [1], prepare=True)
    with pooler.routed(*aliases().values()):
        the_librarys_flows_for_tenant_2()
    with pooler.connect(app) as conn:
        names = {n for (n,) in conn.execute("SELECT name FROM pg_prepared_statements")}
    assert {"_pg3_0", "_pg3_1", "lookup"} <= names


@pytest.mark.variants
def test_a_cursor_held_open_changes_nothing_for_the_next_tenant(pooler, alices_order):
    app = app_alias()
    with pooler.connect(app, autocommit=False) as conn:
        set_tenant(conn, A)
        conn.execute("DECLARE held CURSOR WITH HOLD FOR SELECT sku FROM testapp_order")
        conn.commit()
    with pooler.routed(*aliases().values()):
        the_librarys_flows_for_tenant_2()
    with pooler.connect(app) as conn:  # still open; it holds what tenant 1 saw, no more
        assert conn.execute("FETCH ALL FROM held").fetchall() == [("alice's",)]


@pytest.mark.variants
def test_a_listening_session_hears_nothing_of_the_library_and_disturbs_nothing(
    pooler, alices_order
):
    app = app_alias()
    channel = f"dio_{uuid.uuid4().hex}"
    pooler.leave(app, f"LISTEN {channel}")
    with observer() as conn:
        conn.execute(f"NOTIFY {channel}, 'sent while the session waits in the pool'")
    with pooler.routed(*aliases().values()):
        the_librarys_flows_for_tenant_2()


@pytest.mark.variants
def test_direct_connections_come_back_from_the_librarys_flows_holding_nothing(alices_order):
    names = aliases()
    with Direct().routed(*names.values()):
        readers = {alias: (lambda alias=alias: django_state(alias)) for alias in names.values()}
        # Not even a prepared statement: the hot statements' plans are kept by
        # the functions they call (docs/scaling.md).
        with no_session_state_left(readers):
            the_librarys_flows_for_tenant_2()


@pytest.mark.variants
def test_pooled_sessions_come_back_from_the_librarys_flows_holding_nothing(pooler, alices_order):
    names = aliases()

    def reader(alias: str):
        def read():
            with pooler.connect(alias) as conn:
                return read_state(lambda sql: conn.execute(sql).fetchone())
        return read

    with pooler.routed(*names.values()):
        with no_session_state_left({a: reader(a) for a in names.values()}, pooled=True):
            the_librarys_flows_for_tenant_2()


def test_the_check_sees_each_kind_of_state_it_looks_for(bare_pooler):
    pooler = bare_pooler
    # The check itself can fail: each kind, left on purpose, is reported.
    app = app_alias()

    def read():
        with pooler.connect(app) as conn:
            return read_state(lambda sql: conn.execute(sql).fetchone())

    leftovers = {
        "advisory_locks": "SELECT pg_advisory_lock(42)",
        "prepared_statements": "PREPARE left_behind AS SELECT 1",
        "cursors": "DECLARE left_behind CURSOR WITH HOLD FOR SELECT 1",
        "listening": "LISTEN left_behind",
        "session_settings": "SET statement_timeout = '17s'",
    }
    for kind, statement in leftovers.items():
        with pytest.raises(AssertionError, match=kind):
            with no_session_state_left({app: read}, pooled=True):
                pooler.leave(app, statement)
    with observer() as conn:
        conn.execute(f'GRANT TEMPORARY ON DATABASE "{settings.DATABASES[app]["NAME"]}"'
                     f' TO {settings.DATABASES[app]["USER"]}')
    try:
        with pytest.raises(AssertionError, match="temporary_objects"):
            with no_session_state_left({app: read}, pooled=True):
                pooler.leave(app, "CREATE TEMP TABLE left_behind (a int)")
    finally:
        with observer() as conn:
            conn.execute(f'REVOKE TEMPORARY ON DATABASE "{settings.DATABASES[app]["NAME"]}"'
                         f' FROM {settings.DATABASES[app]["USER"]}')
