"""Claims of the contract that an edit to the library once broke with the suite green.

Each test here names the documented claim it holds and was watched failing on
the edit that breaks it (issue 9; the edits are in mutants/catalogue.py, where
``make mutants`` applies them again).
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db.models.functions import Now
from django.http import JsonResponse
from django.test import RequestFactory

from idempotency import phases, store
from idempotency.conf import REAP_LEASE, idempotency_settings
from idempotency.core import IdempotentRequest, Outcome
from idempotency.decorators import idempotent
from idempotency.phases import Finish, Phases, RecoveryPoint
from tenancy import current_tenant_id, tenant_context
from tests.helpers import as_tenant, connect, count_rows, observer
from tests.idempotency.factories import KeyFactory, PendingKeyFactory
from tests.testapp.auth import USERS
from tests.testapp.models import Order

# make test-variants runs the tests marked `variants` again: those that send a statement
# through the library's aliases, which a deployment variant can change (docs/contributing.md).

DOCUMENTED_UNSTORED = (401, 403, 404, 408, 409, 425, 429)


def stored_keys() -> list[tuple]:
    with observer() as conn:
        return conn.execute(
            "SELECT scope, key, state, status_code FROM idempotency_keys ORDER BY 1, 2"
        ).fetchall()


def answering(status: int):
    """A plain Django view under the decorator that writes an order, then answers ``status``."""
    calls: list[int] = []

    @idempotent(scope="claims.answer")
    def view(request):
        calls.append(status)
        Order.objects.create(tenant_id=current_tenant_id(), sku=f"s{status}")
        return JsonResponse({"status": status}, status=status)

    return view, calls


def post(view, key: str | None = "k1", method: str = "post", user: str = "alice"):
    factory = RequestFactory()
    headers = {"Idempotency-Key": key} if key is not None else {}
    request = getattr(factory, method)(
        "/claims/", json.dumps({"sku": "tea"}) if method == "post" else None,
        content_type="application/json", headers=headers,
    )
    request.user = USERS[user]
    return view(request)


# --- docs/settings.md: UNSTORED_STATUS_CODES, by default 401/403/404/408/409/425/429 ----


# In the variants, 409 only: classify() makes each of these statuses UNSTORED before any
# statement depends on it, so every case sends the same statements through the alias.
@pytest.mark.parametrize("status", [
    pytest.param(status, marks=pytest.mark.variants) if status == 409 else status
    for status in [*DOCUMENTED_UNSTORED, 500, 503]
])
def test_each_default_unstored_status_is_neither_stored_nor_kept(settings, status):
    settings.IDEMPOTENCY = {}  # the library's defaults, nothing configured
    view, calls = answering(status)
    assert post(view).status_code == status
    assert stored_keys() == [] and count_rows("testapp_order") == 0  # writes rolled back
    retried = post(view)
    assert retried.status_code == status and "Idempotent-Replayed" not in retried
    assert calls == [status, status]  # the retry ran the handler again


@pytest.mark.variants
def test_a_final_4xx_outside_the_list_is_stored_and_replayed(settings):
    settings.IDEMPOTENCY = {}
    view, calls = answering(402)
    assert post(view).status_code == 402
    assert stored_keys() == [("claims.answer", "k1", "failed", 402)]
    replayed = post(view)
    assert replayed.status_code == 402 and replayed["Idempotent-Replayed"] == "true"
    assert calls == [402]


def test_the_documented_default_list():
    assert idempotency_settings.UNSTORED_STATUS_CODES == frozenset(DOCUMENTED_UNSTORED)


# --- the contract table: safe methods need no key and run as the request's tenant ---------


@pytest.mark.variants
def test_a_safe_method_needs_no_key_on_a_decorated_view():
    view, calls = answering(200)
    for method in ("get", "head", "options"):
        response = post(view, key=None, method=method)
        assert response.status_code == 200, (method, response.content)
    assert calls == [200, 200, 200]
    with observer() as conn:  # each ran as the request's tenant, and committed
        tenants = [t for (t,) in conn.execute("SELECT tenant_id FROM testapp_order")]
    assert tenants == [USERS["alice"].tenant_id] * 3
    assert stored_keys() == []


@pytest.mark.variants
def test_a_safe_method_with_a_key_is_neither_stored_nor_replayed_on_a_decorated_view():
    view, calls = answering(200)
    first = post(view, key="k1", method="get")
    second = post(view, key="k1", method="get")
    assert first.status_code == second.status_code == 200
    assert "Idempotent-Replayed" not in second
    assert calls == [200, 200] and stored_keys() == []


@pytest.mark.variants
def test_a_safe_method_needs_no_key_on_a_mixin_view(client):
    client.order(key="k1", path="/order-book/")
    for _ in range(2):
        response = client.get("/order-book/", headers={"X-User": "alice", "Idempotency-Key": "g"})
        assert response.status_code == 200, response.content
        assert "Idempotent-Replayed" not in response
        assert [o["sku"] for o in response.json()] == ["tea"]
    assert client.get("/order-book/", headers={"X-User": "alice"}).status_code == 200
    assert [k for (_s, k, _st, _c) in stored_keys()] == ["k1"]  # the GETs stored nothing


# --- docs/settings.md: IN_PROGRESS_WAIT, 0 by default: a duplicate in flight is a 409 at once


@pytest.mark.variants
def test_a_duplicate_in_flight_is_answered_at_once_by_default(settings, client, monkeypatch):
    settings.IDEMPOTENCY = {}  # IN_PROGRESS_WAIT left at its default
    assert idempotency_settings.IN_PROGRESS_WAIT == 0
    lookups: list[int] = []
    real_lookup = store.lookup
    with observer() as holder:

        def lookup(alias, request, *, lock=False):
            # The first request is "still running": its key's lock is held elsewhere.
            if not lookups:
                holder.execute("SELECT pg_advisory_lock(%s)", [request.lock_id])
            lookups.append(request.lock_id)
            return real_lookup(alias, request, lock=lock)

        monkeypatch.setattr(store, "lookup", lookup)
        response = client.order(key="k1")
    assert response.status_code == 409
    assert response["Retry-After"] == "1"
    assert len(lookups) == 1, f"the duplicate looked the key up {len(lookups)} times: it waited"
    assert count_rows("testapp_order") == 0 and stored_keys() == []


# --- DESIGN/guarantees: every time comparison uses the database clock, never the app's --------


@pytest.mark.variants
def test_expires_at_is_set_by_the_database_clock_even_when_the_app_clock_is_wrong(
    settings, client, monkeypatch
):
    from django.utils import timezone

    settings.IDEMPOTENCY = {"TTL": 3600}
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + dt.timedelta(hours=5))
    assert client.order(key="k1").status_code == 201
    with observer() as conn:
        created, expires, db_now = conn.execute(
            "SELECT created_at, expires_at, now() FROM idempotency_keys"
        ).fetchone()
    assert expires - created == dt.timedelta(hours=1)  # both from one transaction's now()
    assert dt.timedelta(minutes=59) < expires - db_now <= dt.timedelta(hours=1)
    replayed = client.order(key="k1")  # and the key is live by the database clock
    assert replayed["Idempotent-Replayed"] == "true"


# --- docs/scaling.md: "TTLs, leases, COMPLETE_AFTER, STUCK_AFTER and retention are all
# compared with now() in SQL, so the hosts' clocks may disagree" (the outbox's half:
# tests/outbox/test_claims.py) ---------------------------------------------------------


def _seconds_left(sql: str) -> float:
    with observer() as conn:
        return conn.execute(f"SELECT extract(epoch FROM {sql})::float").fetchone()[0]


def _plant_pending(key: str, touched: dt.timedelta) -> None:
    """A pending capture nobody holds, created and last touched ``touched`` ago."""
    with tenant_context(1):
        PendingKeyFactory(key=key, created_at=Now() - touched, updated_at=Now() - touched)


# In the variants, 5 hours ahead only: the offset moves Python's clock alone, which no variant
# touches; both cases send the same statements (the fixture's two cases, tests/conftest.py).
@pytest.mark.parametrize("wrong_app_clock", [
    pytest.param(5, id="app-clock-5h-ahead", marks=pytest.mark.variants),
    pytest.param(-5, id="app-clock-5h-behind"),
], indirect=True)
def test_every_lease_and_horizon_of_the_keys_is_the_database_clocks(settings, wrong_app_clock):
    from idempotency.reaper import reap_expired_keys
    from tenancy.aliases import system_alias

    # A phases-mode claim's lease.
    _pending(lease=dt.timedelta(seconds=30))
    lease = _seconds_left("(SELECT locked_until FROM idempotency_keys) - clock_timestamp()")
    assert 25 < lease <= 30
    with observer() as conn:
        conn.execute("DELETE FROM idempotency_keys")

    # The key reaper's lease, while it runs.
    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "GIVE_UP_AFTER": 3600}  # STUCK_AFTER: 1 h
    leases: list[float] = []
    with tenant_context(1):
        KeyFactory(created_at=Now() - dt.timedelta(days=2),
                   expires_at=Now() - dt.timedelta(minutes=1))
    reap_expired_keys(progress=lambda line: leases.append(_seconds_left(
        "(SELECT until FROM idempotency_leases WHERE name = 'reaper') - now()")))
    assert len(leases) == 1 and 50 < leases[0] <= REAP_LEASE

    # Horizons: STUCK_AFTER and GIVE_UP_AFTER (the reaper), COMPLETE_AFTER (the completer).
    _plant_pending("a minute old", dt.timedelta(minutes=1))
    _plant_pending("two hours old", dt.timedelta(hours=2))
    report = reap_expired_keys(dry_run=True)
    assert [k.key for k in report.stuck] == ["two hours old"]
    assert report.gave_up == 1
    found = store.abandoned_keys(system_alias(), ["payment.capture"], dt.timedelta(hours=1), 10)
    assert [k.key for k in found] == ["two hours old"]


# --- docs/phases.md: a fencing token stops a stale owner; a lease is taken over only when out ---


def _pending(lease: dt.timedelta):
    from idempotency import core
    from tenancy import tenant_context
    from tenancy.aliases import app_alias

    request = core.IdempotentRequest(1, "claims.phases", "k", "f" * 64, "POST", "/x")
    with tenant_context(1):
        claim = store.claim(app_alias(), request, recovery_point="started", request_data={},
                            lease=lease, ttl=dt.timedelta(hours=1))
    assert claim is not None and claim.token == 1
    return request


def _key_row() -> tuple:
    with observer() as conn:
        return conn.execute(
            "SELECT recovery_point, lease_token, locked_until > clock_timestamp()"
            " FROM idempotency_keys"
        ).fetchone()


@pytest.mark.variants
def test_a_stale_owner_cannot_commit_a_phase_over_the_new_owner():
    from tenancy import tenant_context
    from tenancy.aliases import app_alias

    request = _pending(lease=dt.timedelta(seconds=30))
    with observer() as conn:  # the lease ran out; another run took the key over (token 2)
        conn.execute("UPDATE idempotency_keys SET lease_token = 2")
    with tenant_context(1):
        stale = store.advance(app_alias(), request, 1, recovery_point="charged",
                              phase_state={"by": "stale"}, lease=dt.timedelta(seconds=30))
    assert stale is False
    assert _key_row()[:2] == ("started", 2)
    with tenant_context(1):
        assert store.advance(app_alias(), request, 2, recovery_point="charged",
                             phase_state={"by": "owner"}, lease=dt.timedelta(seconds=30))
    assert _key_row()[:2] == ("charged", 2)


@pytest.mark.variants
def test_a_pending_key_is_taken_over_only_once_its_lease_has_run_out():
    from tenancy import tenant_context
    from tenancy.aliases import app_alias

    request = _pending(lease=dt.timedelta(minutes=5))
    with tenant_context(1):
        assert store.take_over(app_alias(), request, 1, dt.timedelta(seconds=30)) is None
    assert _key_row() == ("started", 1, True)  # the live owner keeps it
    with observer() as conn:
        conn.execute("UPDATE idempotency_keys SET locked_until = clock_timestamp() - interval '1s'")
    with tenant_context(1):
        taken = store.take_over(app_alias(), request, 1, dt.timedelta(seconds=30))
    assert taken is not None and taken.token == 2


# --- docs/phases.md: the fencing token stops a stale owner ----------------------------


class _TakenOverDuring(Phases):
    """A program whose first phase writes, then loses its key to a new owner
    (another process bumps the fencing token, as a take-over after the
    lease does) before its commit; what the phase returns is a class attribute."""

    scope = "claims.fenced"
    returns: object = None
    later: list[str] = []

    def started(self, ctx):
        Order.objects.create(tenant_id=current_tenant_id(), sku="stale owner")
        with connect() as other, as_tenant(other, 1) as cur:
            cur.execute("UPDATE idempotency_keys SET lease_token = lease_token + 1"
                        " WHERE scope = %s AND key = 'fenced'", [self.scope])
        return self.returns

    def second(self, ctx):
        self.later.append("second")
        return Finish(201, {"done": True})


def _run_fenced(returns):
    program = type("Fenced", (_TakenOverDuring,), {"returns": returns, "later": []})
    request = IdempotentRequest(tenant_id=1, scope=program.scope, key="fenced",
                                fingerprint="f" * 64, method="POST", path="/x")
    return program, phases.execute(program, request, wait=0)


def fenced_row():
    with observer() as conn:
        return conn.execute(
            "SELECT state, lease_token, recovery_point FROM idempotency_keys WHERE key = 'fenced'"
        ).fetchone()


@pytest.mark.variants
def test_a_stale_owner_whose_phase_commit_fails_the_token_stops_and_its_writes_roll_back():
    program, result = _run_fenced(RecoveryPoint("second"))
    assert result.outcome is Outcome.IN_PROGRESS  # LeaseLost: the new owner goes on
    assert program.later == []  # the next phase never ran
    assert count_rows("testapp_order") == 0  # the phase's writes rolled back with it
    assert fenced_row() == ("pending", 2, "started")  # the new owner's row, untouched


@pytest.mark.variants
def test_a_stale_owner_cannot_finish_over_the_new_owner():
    program, result = _run_fenced(Finish(201, {"done": True}))
    assert result.outcome is Outcome.IN_PROGRESS
    assert count_rows("testapp_order") == 0
    assert fenced_row() == ("pending", 2, "started")  # not finished by the stale owner
