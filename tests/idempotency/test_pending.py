"""No key stays pending forever (phases mode).

Every outcome of a program stores an answer, forgets the key, or leaves it
for the completer, which gives up after ``COMPLETE_MAX_ATTEMPTS``; the reaper
gives up on whatever nothing has touched for ``GIVE_UP_AFTER``.
"""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db.models.functions import Now

from idempotency import phases
from idempotency.completer import complete_abandoned_keys
from idempotency.core import IdempotentRequest, Outcome
from idempotency.phases import Finish, Phases, RecoveryPoint, Retry
from idempotency.reaper import reap_expired_keys
from tenancy import tenant_context
from tests.helpers import count_rows, observer
from tests.idempotency.factories import PendingKeyFactory
from tests.testapp.models import Order

A = 1  # alice's tenant (tests/testapp/auth.py)


def capture_order(client, pk, key, user="alice"):
    return client.post(f"/orders/{pk}/capture/", {}, format="json",
                       headers={"X-User": user, "Idempotency-Key": key})


def keys(where="TRUE"):
    return count_rows("idempotency_keys", where)


def an_order(note=""):
    with tenant_context(A):
        return Order.objects.create(tenant_id=A, sku="tea", note=note).pk


# --- the first phase: refused or failed before anything happened -----------------


def test_a_finish_with_an_unstored_status_in_the_first_phase_forgets_the_key(client):
    pk = an_order(note="captured")
    refused = capture_order(client, pk, "k-409")
    assert refused.status_code == 409 and refused.json()["code"] == "already_captured"
    assert keys() == 0  # forgotten, as a DRF refusal is
    again = capture_order(client, pk, "k-409")
    assert again.status_code == 409 and "Idempotent-Replayed" not in again  # ran again


def test_a_non_drf_exception_in_the_first_phase_leaves_no_key(client):
    client.raise_request_exception = False
    assert capture_order(client, "abc", "k-abc").status_code == 500  # ValueError
    assert capture_order(client, 999999, "k-missing").status_code == 500  # DoesNotExist
    assert keys() == 0


def test_a_flood_of_fresh_keys_that_fail_leaves_nothing_pending(client):
    client.raise_request_exception = False
    statuses = {capture_order(client, "abc", f"fuzz-{n}").status_code for n in range(200)}
    assert statuses == {500}
    assert keys() == 0
    assert complete_abandoned_keys(older_than=0).found == 0  # no work for the completer


def test_djangos_http404_in_a_phase_answers_as_drfs_own_404(client, monkeypatch):
    from django.http import Http404

    from tests.testapp.payments import CaptureOrder

    def not_found(self, ctx):
        raise Http404("No such order.")

    monkeypatch.setattr(CaptureOrder, "started", not_found)
    assert capture_order(client, 1, "k-first").status_code == 404
    assert keys() == 0  # refused before anything happened: forgotten
    monkeypatch.setattr(CaptureOrder, "started", lambda self, ctx: RecoveryPoint("looked"))
    monkeypatch.setattr(CaptureOrder, "looked", not_found, raising=False)
    assert capture_order(client, 1, "k-later").status_code == 404
    assert keys("state = 'failed' AND status_code = 404") == 1  # a refusal, stored as final
    replay = capture_order(client, 1, "k-later")
    assert replay.status_code == 404 and replay["Idempotent-Replayed"] == "true"


def run(program, key="k", **kwargs):
    request = IdempotentRequest(tenant_id=A, scope=program.scope, key=key,
                                fingerprint="f" * 64, method="POST", path="/x")
    return phases.execute(program, request, **kwargs)


def key_row(key="k"):
    with observer() as conn:
        return conn.execute(
            "SELECT state, status_code, recovery_point, response, completer_runs"
            " FROM idempotency_keys WHERE key = %s", [key]).fetchone()


class RefusedLate(Phases):
    scope = "test.refused-late"

    def started(self, ctx):
        return RecoveryPoint("checked")

    def checked(self, ctx):
        return Finish(409, {"code": "conflict"})


def test_a_finish_with_an_unstored_status_after_a_committed_phase_is_stored_as_final():
    first = run(RefusedLate)
    assert first.value.status_code == 409
    assert key_row()[:3] == ("failed", 409, "finished")  # it cannot be forgotten: stored
    replay = run(RefusedLate)
    assert replay.outcome is Outcome.REPLAYED and replay.stored.status_code == 409


class ForeignThenRefused(Phases):
    scope = "test.foreign-then-refused"

    def started(self, ctx):
        ctx.foreign_key("charge")  # a foreign system may now know this request
        return Finish(409, {"code": "conflict"})


def test_a_refusal_after_a_foreign_key_was_handed_out_is_kept():
    assert run(ForeignThenRefused).value.status_code == 409
    assert key_row()[:2] == ("failed", 409)


class FailingStart(Phases):
    scope = "test.failing-start"

    def started(self, ctx):
        raise ValueError("bad input")


def test_a_take_over_that_fails_in_the_first_phase_keeps_the_key():
    # A run that was killed in "started" (its lease ran out): it may have called
    # the gateway, so the retry that fails there too must not forget the key.
    with tenant_context(A):
        PendingKeyFactory(scope=FailingStart.scope, key="k", request_path="/x",
                          recovery_point="started", lease_token=1,
                          locked_until=Now() - timedelta(seconds=1))
    with pytest.raises(ValueError):
        run(FailingStart)
    assert key_row()[:3] == ("pending", None, "started")
    with pytest.raises(ValueError):
        run(FailingStart, key="fresh")  # a new key failing the same way: forgotten
    assert key_row("fresh") is None


# --- later phases: transient failures, the completer's bound ------------------------


class AlwaysUnavailable(Phases):
    scope = "test.always-unavailable"
    completable = True

    def started(self, ctx):
        return RecoveryPoint("charging", amount=10)

    def charging(self, ctx):
        raise Retry("the gateway is down")


def test_the_completer_gives_up_after_its_attempts_and_stores_the_abandoned_answer(settings):
    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "COMPLETE_MAX_ATTEMPTS": 3}
    assert run(AlwaysUnavailable).value.status_code == 503  # the client gives up here
    assert key_row()[:3] == ("pending", None, "charging")
    for attempt in (1, 2):
        report = complete_abandoned_keys(older_than=0)
        assert (report.found, report.failed, report.gave_up) == (1, 1, 0)
        assert key_row()[4] == attempt
    out = io.StringIO()
    with pytest.raises(CommandError, match="1 keys were given up on"):
        call_command("complete_idempotency_keys", "--older-than", "0", "-v", "2", stdout=out)
    assert "gave up after 3 attempts at charging: answers 500" in out.getvalue()
    assert "Gave up on 1 keys" in out.getvalue()
    state, status, point, body, runs = key_row()
    assert (state, status, point, runs) == ("failed", 500, "charging", 3)
    problem = json.loads(bytes(body))
    assert problem["code"] == "idempotency_request_abandoned" and problem["status"] == 500
    assert complete_abandoned_keys(older_than=0).found == 0  # no more work, ever
    replay = run(AlwaysUnavailable)  # what the client sees when it comes back
    assert replay.outcome is Outcome.REPLAYED
    assert replay.stored.status_code == 500 and json.loads(replay.stored.body) == problem
    assert ("Content-Type", "application/problem+json") in replay.stored.headers


def test_the_abandoned_answer_is_replayed_over_http(client, settings, crash):
    from tests.idempotency.test_phases import capture

    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "COMPLETE_MAX_ATTEMPTS": 1}
    client.raise_request_exception = False
    crash("raise", "after_gateway")
    assert capture(client).status_code == 500  # charged; the client goes away
    crash("raise", "after_gateway")
    assert complete_abandoned_keys(older_than=0).gave_up == 1
    replay = capture(client)
    assert replay.status_code == 500 and replay["Idempotent-Replayed"] == "true"
    assert replay["Content-Type"] == "application/problem+json"
    assert replay.json()["code"] == "idempotency_request_abandoned"


# --- the reaper's horizon -------------------------------------------------------------


def pending_key(key, scope, hours_untouched, leased=False):
    untouched = Now() - timedelta(hours=hours_untouched)
    with tenant_context(A):
        PendingKeyFactory(scope=scope, key=key, request_path="/x", recovery_point="charging",
                          created_at=untouched, updated_at=untouched, lease_token=1,
                          expires_at=Now() - timedelta(hours=1),
                          locked_until=Now() + timedelta(minutes=1) if leased else None)


def test_the_reaper_gives_up_on_pending_keys_nothing_touched_for_the_horizon():
    pending_key("old", "no.such.program", 100)  # a scope no deployed program has
    pending_key("old-completable", AlwaysUnavailable.scope, 80)
    pending_key("recent", "no.such.program", 2)
    pending_key("old-but-leased", "no.such.program", 100, leased=True)
    dry = reap_expired_keys(dry_run=True)
    assert dry.gave_up == 2 and keys("state = 'pending'") == 4
    out = io.StringIO()
    call_command("reap_idempotency_keys", stdout=out)
    assert "Gave up on 2 pending keys" in out.getvalue()
    assert "key 'old' stopped at charging" in out.getvalue()
    with observer() as conn:
        rows = dict(conn.execute(
            "SELECT key, state || ' ' || coalesce(status_code::text, '') FROM idempotency_keys"
        ).fetchall())
    assert rows == {"old": "failed 500", "old-completable": "failed 500", "recent": "pending ",
                    "old-but-leased": "pending "}
    assert keys("state = 'failed' AND expires_at > now()") == 2  # replayed for a TTL, then reaped


def test_the_reaper_keeps_its_hands_off_pending_keys_inside_the_horizon(settings):
    settings.IDEMPOTENCY = {**settings.IDEMPOTENCY, "GIVE_UP_AFTER": timedelta(hours=200)}
    pending_key("old", "no.such.program", 100)
    assert reap_expired_keys().gave_up == 0
    assert keys("state = 'pending'") == 1
