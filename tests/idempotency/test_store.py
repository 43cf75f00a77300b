"""idempotency.store: its statements match the table, its rows are typed.

These fail at once, without a request flow, when a column of
``idempotency_keys`` is renamed in the model and the migration but not in
the store (every statement of the query files is checked against the tables
by tests/test_queries.py).
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from idempotency import core, store
from tenancy import tenant_context
from tenancy.aliases import app_alias
from tests.helpers import app_connection, count_rows, observer

PARAMS = {
    "tenant_id": 1, "scope": "s", "key": "k", "lock_id": 7, "fingerprint": "f" * 64,
    "method": "POST", "path": "/x", "state": "completed", "status_code": 201,
    "response": b"{}", "response_headers": "[]", "ttl": timedelta(hours=1),
    "recovery_point": "started", "request_data": "{}", "phase_state": "{}",
    "lease": timedelta(seconds=30), "token": 1, "after": timedelta(hours=1), "limit": 10,
}


def request(key="k", fingerprint="f" * 64):
    return core.IdempotentRequest(1, "s", key, fingerprint, "POST", "/x")


def finished(ttl=timedelta(hours=1)):
    """A finished key, stored as a request stores it (a negative ``ttl``: expired)."""
    answer = core.StoredResponse(201, b"body", (("Content-Type", "application/json"),))
    with tenant_context(1):
        assert store.insert_finished(app_alias(), request(), answer, "completed", ttl, commit=False)


def pending(token=3, lease=timedelta(minutes=1)):
    """A pending key (phases mode) owned by the run with ``token``."""
    with tenant_context(1):
        store.claim(app_alias(), request(), recovery_point="started", request_data={},
                    lease=lease, ttl=timedelta(hours=1))
    with observer() as o:
        o.execute("UPDATE idempotency_keys SET lease_token = %s", [token])


@pytest.mark.parametrize(
    "name, row_type",
    [("lookup", store.KeyLookup), ("claim", store.Claim), ("take_over", store.Claim),
     ("give_up_untouched", store.GivenUp)],
)
def test_a_row_types_fields_are_its_statements_columns(name, row_type):
    with tenant_context(1), app_connection().cursor() as cursor:
        cursor.execute(store.SQL[name], PARAMS)
        names = [column.name for column in cursor.description]
    assert names == [field.name for field in dataclasses.fields(row_type)]


def test_a_lookup_tells_no_row_from_an_expired_row_from_a_live_one():
    with tenant_context(1):
        nothing = store.lookup(app_alias(), request(), lock=True)
    assert (nothing.exists, nothing.live, nothing.locked) == (False, None, True)
    assert nothing.state is None
    finished(ttl=timedelta(seconds=-1))
    with tenant_context(1):
        expired = store.lookup(app_alias(), request(), lock=True)
    assert (expired.exists, expired.live, expired.locked) == (True, False, True)
    with observer() as o:
        o.execute("UPDATE idempotency_keys SET expires_at = now() + interval '1 hour'")
    with tenant_context(1):
        live = store.lookup(app_alias(), request(), lock=True)
    assert isinstance(live, store.KeyLookup) and not isinstance(live, tuple)
    assert (live.live, live.locked, live.status_code) == (True, None, 201)
    assert live.fingerprint == "f" * 64
    assert live.response == b"body"
    assert live.response_headers == [["Content-Type", "application/json"]]  # decoded


def test_a_pending_key_is_leased_while_its_lock_runs():
    pending(token=3)
    with tenant_context(1):
        found = store.lookup(app_alias(), request())
    assert (found.live, found.leased, found.lease_token, found.locked) == (True, True, 3, None)


def test_the_lease_release_and_forget_are_compare_and_set_on_the_token():
    pending(token=3)
    with tenant_context(1):
        store.release(app_alias(), request(), token=2)  # a stale owner: nothing happens
        assert store.lookup(app_alias(), request()).leased
        store.release(app_alias(), request(), token=3)
        assert not store.lookup(app_alias(), request()).leased
        store.forget(app_alias(), request(), token=2, recovery_point="started")
    assert count_rows("idempotency_keys") == 1
    with tenant_context(1):
        store.forget(app_alias(), request(), token=3, recovery_point="started")
    assert count_rows("idempotency_keys") == 0


def test_a_claim_returns_a_typed_claim_and_a_duplicate_gets_none():
    with tenant_context(1):
        first = store.claim(app_alias(), request(), recovery_point="started",
                            request_data={"data": 1}, lease=timedelta(seconds=30),
                            ttl=timedelta(hours=1))
        again = store.claim(app_alias(), request(), recovery_point="started",
                            request_data={}, lease=timedelta(seconds=30), ttl=timedelta(hours=1))
    assert isinstance(first, store.Claim)
    assert (first.token, first.recovery_point, first.phase_state) == (1, "started", {})
    assert len(first.request_id) == 36 and again is None


@pytest.mark.plain_context(reason="the verified context has no peek (the next test)")
def test_a_peek_reads_the_key_in_autocommit_as_the_tenant_and_leaves_nothing_set():
    finished()
    app_connection().ensure_connection()
    found = store.peek(app_alias(), request())
    assert found is not None and (found.live, found.status_code, found.response) == (
        True, 201, b"body"
    )
    # Row-level security applied: another tenant's peek at the same key finds no row.
    other = store.peek(app_alias(), dataclasses.replace(request(), tenant_id=2))
    assert other is not None and not other.exists
    # Nothing is left open or set on the connection.
    assert app_connection().get_autocommit() and not app_connection().in_atomic_block
    with app_connection().cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('app.tenant_id', true), count(*) FROM idempotency_keys"
        )
        setting, visible = cursor.fetchone()
    assert setting in (None, "") and visible == 0


def test_in_the_verified_context_a_peek_stands_aside(settings):
    # docs/roles.md: a verified token is bound to a transaction's start, which
    # a message sent in autocommit cannot know before it runs; the key is
    # looked up in the request's transaction instead.
    from tests.settings import VERIFIED_CONTEXT_KEY

    settings.TENANCY = {**settings.TENANCY, "VERIFIED_CONTEXT": VERIFIED_CONTEXT_KEY}
    finished()
    app_connection().ensure_connection()
    assert store.peek(app_alias(), request()) is None


def test_a_peek_is_refused_inside_a_transaction():
    # There, its SET LOCAL would outlive the read: the caller reads in its transaction.
    finished()
    with tenant_context(1):
        assert store.peek(app_alias(), request()) is None
        assert store.lookup(app_alias(), request()).live
