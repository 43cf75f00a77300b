"""The state machine without DRF: races settled by the primary key."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now

from idempotency import core
from tenancy import current_tenant_id, tenant_context
from tenancy.aliases import app_alias
from tests.helpers import app_atomic, app_connection, as_tenant, connect, count_rows, observer
from tests.idempotency.factories import PendingKeyFactory
from tests.testapp.models import Order


def request(key="k", fingerprint="f" * 64):
    return core.IdempotentRequest(
        tenant_id=1, scope="core", key=key, fingerprint=fingerprint, method="POST", path="/x"
    )


def stored(status=201, body=b"{}"):
    return core.StoredResponse(status, body, (("Content-Type", "application/json"),))


def insert_row(cur, fingerprint="f" * 64, body=b"racer", expires="1 hour"):
    cur.execute(
        "INSERT INTO idempotency_keys (tenant_id, scope, key, request_hash, request_method,"
        " request_path, state, status_code, response, response_headers, expires_at)"
        " VALUES (1, 'core', 'k', %s, 'POST', '/x', 'completed', 201, %s,"
        ' \'[["Content-Type", "application/json"]]\', now() + %s::interval)',
        [fingerprint, body, expires],
    )


def test_a_key_stored_by_a_racer_after_our_lookup_wins_and_our_writes_roll_back():
    calls = []

    def handler():
        calls.append(1)
        Order.objects.create(tenant_id=current_tenant_id(), sku="ours")
        # A racer commits the same key between our lookup and our store.
        with connect() as other, as_tenant(other, 1) as cur:
            insert_row(cur)
        return stored(body=b"ours")

    result = core.execute(request(), handler, lambda r: r)
    assert result.outcome is core.Outcome.REPLAYED
    assert result.stored is not None and result.stored.body == b"racer"
    assert calls == [1]
    assert count_rows("testapp_order") == 0
    assert count_rows("idempotency_keys") == 1


def test_an_expired_row_reaped_mid_flight_is_inserted_afresh():
    with connect() as conn, as_tenant(conn, 1) as cur:
        insert_row(cur, expires="-1 second")
    calls = []

    def handler():
        calls.append(1)
        Order.objects.create(tenant_id=current_tenant_id(), sku="x")
        if len(calls) == 1:
            with observer() as o:
                o.execute("DELETE FROM idempotency_keys")  # the reaper got there first
        return stored(body=b"new")

    result = core.execute(request(), handler, lambda r: r)
    assert result.outcome is core.Outcome.EXECUTED
    assert calls == [1, 1]  # the first attempt was rolled back, the second stored
    assert count_rows("testapp_order") == 1
    with observer() as o:
        assert o.execute("SELECT response FROM idempotency_keys").fetchone()[0] == b"new"


def test_an_expired_row_is_taken_over_in_place():
    with connect() as conn, as_tenant(conn, 1) as cur:
        insert_row(cur, fingerprint="0" * 64, expires="-1 second")
    result = core.execute(request(), lambda: stored(body=b"new"), lambda r: r)
    assert result.outcome is core.Outcome.EXECUTED
    with observer() as o:
        row = o.execute("SELECT request_hash, response, expires_at > now() FROM idempotency_keys")
        assert row.fetchone() == ("f" * 64, b"new", True)


@pytest.mark.parametrize("outer", [False, True], ids=["own transaction", "caller's transaction"])
def test_a_pending_key_answers_in_progress_never_a_replay(outer):
    # A phases program's claim under the same scope and key, still running:
    # the row is pending, with no answer yet. Whether it is read in
    # autocommit (store.peek) or in the caller's transaction, the answer is
    # "in progress" and the handler does not run.
    with tenant_context(1):
        PendingKeyFactory(scope="core", key="k", request_path="/x", lease_token=1,
                          locked_until=Now() + timedelta(hours=1))
    calls = []

    def handler():
        calls.append(1)
        return stored()

    if outer:
        with app_atomic():
            result = core.execute(request(), handler, lambda r: r, wait=0)
    else:
        result = core.execute(request(), handler, lambda r: r, wait=0)
    assert result.outcome is core.Outcome.IN_PROGRESS
    assert calls == []


def test_in_progress_without_wait_and_replay_after_wait(monkeypatch):
    import threading
    import time

    from django.db import connections
    from django.test import override_settings

    entered, release = threading.Event(), threading.Event()

    def slow():
        entered.set()
        release.wait(60)
        return stored(body=b"first")

    def first():
        try:
            core.execute(request(), slow, lambda r: r)
        finally:
            connections.close_all()

    t = threading.Thread(target=first)
    t.start()
    try:
        assert entered.wait(60)  # the first request runs its handler, holding the key
        assert core.execute(request(), slow, lambda r: r, wait=0).outcome is (
            core.Outcome.IN_PROGRESS)
        real_sleep, pauses = time.sleep, []

        def finish_the_first_once_waiting(seconds):
            pauses.append(seconds)
            release.set()  # the duplicate saw the key in progress and waits: the first ends
            real_sleep(seconds)

        monkeypatch.setattr(core.time, "sleep", finish_the_first_once_waiting)
        with override_settings(IDEMPOTENCY={"IN_PROGRESS_WAIT": 5}):  # the setting
            waited = core.execute(request(), slow, lambda r: r)
    finally:
        release.set()
        t.join(60)
    assert pauses  # the duplicate waited...
    assert waited.outcome is core.Outcome.REPLAYED and waited.stored.body == b"first"  # ...for it


@pytest.mark.parametrize(
    "status, verdict",
    [
        (200, "completed"),
        (201, "completed"),
        (302, "completed"),
        (400, "failed"),
        (402, "failed"),
        (422, "failed"),
        (404, "unstored"),
        (409, "unstored"),
        (429, "unstored"),
        (500, "unstored"),
        (503, "unstored"),
    ],
)
def test_which_answers_are_stored(status, verdict):
    assert core.classify(status).value == verdict


def test_the_lock_id_is_a_signed_64_bit_integer_per_tenant_scope_and_key():
    ids = {
        core.IdempotentRequest(t, s, k, "").lock_id
        for t in (1, 2)
        for s in ("a", "b")
        for k in ("x", "y")
    }
    assert len(ids) == 8
    assert all(-(2**63) <= i < 2**63 for i in ids)


def test_ttl_must_be_positive():
    from idempotency.conf import as_timedelta

    assert as_timedelta(5, "TTL") == timedelta(seconds=5)
    with pytest.raises(ValueError):
        as_timedelta(0, "TTL")
    with pytest.raises(TypeError):
        as_timedelta("1h", "TTL")


def test_on_commit_callbacks_of_a_stored_answer_run_once_after_commit():
    from django.db import transaction

    ran = []

    def handler():
        Order.objects.create(tenant_id=current_tenant_id(), sku="x")
        transaction.on_commit(lambda: ran.append(count_rows("testapp_order")), using=app_alias())
        return stored(201)

    core.execute(request(), handler, lambda r: r)
    assert ran == [1]  # called once, and the order was already committed


def test_on_commit_callbacks_of_a_rolled_back_handler_never_run():
    from django.db import transaction

    ran = []

    def handler():
        transaction.on_commit(lambda: ran.append("charged"), using=app_alias())
        return stored(402)

    result = core.execute(request(), handler, lambda r: r)
    assert result.verdict is core.Verdict.FAILED
    assert ran == []
    assert count_rows("idempotency_keys", "state = 'failed'") == 1


def test_inside_an_outer_transaction_everything_commits_with_it():
    with app_atomic():
        result = core.execute(request(), lambda: stored(201), lambda r: r)
        assert result.outcome is core.Outcome.EXECUTED
        assert count_rows("idempotency_keys") == 0  # not committed yet
    assert count_rows("idempotency_keys") == 1


def guc() -> str | None:
    with app_connection().cursor() as cursor:
        cursor.execute("SELECT current_setting('app.tenant_id', true)")
        return cursor.fetchone()[0]


@pytest.mark.parametrize("outcome", ["executed", "replayed"])
def test_nested_in_a_tenant_context_the_outer_tenant_is_restored(outcome):
    from tenancy import tenant_context

    if outcome == "replayed":
        core.execute(request(), lambda: stored(201), lambda r: r)
    with tenant_context(7):
        core.execute(request(), lambda: stored(201), lambda r: r)
        assert guc() == "7"
        assert current_tenant_id() == 7
        assert Order.objects.count() == 0  # tenant 7 sees its own rows only


def test_inside_a_plain_atomic_block_no_tenant_is_left_behind():
    with app_atomic():  # what ATOMIC_REQUESTS does around a view
        core.execute(request(), lambda: stored(201), lambda r: r)
        assert guc() == ""
        core.execute(request(), lambda: stored(201), lambda r: r)  # the replay path
        assert guc() == ""


@pytest.fixture
def temporary_allowed():
    """The app role may create temporary tables (migrate takes TEMPORARY away from it)."""
    from django.conf import settings

    db = settings.DATABASES[app_alias()]
    with observer() as conn:
        conn.execute(f'GRANT TEMPORARY ON DATABASE "{db["NAME"]}" TO "{db["USER"]}"')
    yield
    with observer() as conn:
        conn.execute(f'REVOKE TEMPORARY ON DATABASE "{db["NAME"]}" FROM "{db["USER"]}"')


def test_a_handler_error_at_the_merged_commit_is_not_taken_for_a_lost_race(temporary_allowed):
    # A deferred constraint fails only at COMMIT, which travels with the key's
    # INSERT: it must surface as the handler's error, not re-run the handler.
    # (A temporary table dropped at that COMMIT carries the constraint.)
    from django.db import IntegrityError

    calls = []

    def handler():
        calls.append(1)
        Order.objects.create(tenant_id=current_tenant_id(), sku="x")

        with app_connection().cursor() as cursor:
            cursor.execute("CREATE TEMP TABLE deferred_check (v int UNIQUE DEFERRABLE INITIALLY "
                           "DEFERRED) ON COMMIT DROP")
            cursor.execute("INSERT INTO deferred_check VALUES (1), (1)")
        return stored(201)

    with pytest.raises(IntegrityError):
        core.execute(request(), handler, lambda r: r)
    assert calls == [1]
    assert count_rows("testapp_order") == 0 and count_rows("idempotency_keys") == 0
