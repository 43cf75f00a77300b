"""Phases mode: a payment capture against a gateway that counts its charges.

Every crash boundary, by exception and by SIGKILL, ends after a retry with
exactly one charge at the gateway, one local payment row, one stored answer.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from idempotency import phases
from idempotency.core import IdempotentRequest, Outcome
from tenancy import tenant_context
from tenancy.aliases import app_alias
from tests.helpers import app_atomic, count_rows, lock_waits, observer, wait_for
from tests.idempotency.factories import PendingKeyFactory
from tests.testapp.payments import CapturePayment

BOUNDARIES = ["after_key_insert", "in_local_phase", "after_local_phase", "after_gateway",
              "before_response"]
#: In "started", before its recovery point commits: a failure there leaves nothing.
FIRST_PHASE = {"after_key_insert", "in_local_phase"}


def capture(client, key="cap-1", order="A1", amount=1000, user="alice"):
    return client.post(
        f"/payments/{order}/capture/", {"amount": amount}, format="json",
        headers={"X-User": user, "Idempotency-Key": key},
    )


def key_row(key="cap-1"):
    with observer() as conn:
        return conn.execute(
            "SELECT state, status_code, recovery_point, lease_token, locked_until IS NOT NULL"
            " FROM idempotency_keys WHERE key = %s", [key],
        ).fetchone()


def assert_exactly_once(gateway, key="cap-1"):
    assert gateway.stats()["charges"] == 1
    assert count_rows("testapp_payment") == 1
    assert count_rows("testapp_payment", "charge_id IS NOT NULL") == 1
    assert key_row(key)[:2] == ("completed", 201)
    assert count_rows("outbox_messages", "topic = 'payment.captured'") == 1


def test_a_capture_runs_its_phases_once_and_replays(client, gateway):
    first = capture(client)
    assert first.status_code == 201, first.content
    assert first["Location"].startswith("/payments/")
    again = capture(client)
    assert again.status_code == 201 and again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert_exactly_once(gateway)
    assert key_row()[2] == "finished"


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_an_exception_at_every_boundary_then_a_retry_charges_once(client, gateway, crash,
                                                                    boundary):
    client.raise_request_exception = False
    crash("raise", boundary)
    failed = capture(client)
    assert failed.status_code == 500
    if boundary in FIRST_PHASE:
        assert key_row() is None  # nothing of it happened: forgotten, nothing pending
    else:
        state, _, _, _, leased = key_row()
        assert state == "pending" and not leased  # the lease was released at once
    retry = capture(client)
    assert retry.status_code == 201, retry.content
    assert "Idempotent-Replayed" not in retry
    assert_exactly_once(gateway)


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_worker_killed_at_every_boundary_then_a_retry_charges_once(payments_server, gateway,
                                                                     crash, boundary):
    crash("kill", boundary)
    url = payments_server.url + "/payments/A1/capture/"
    headers = {"X-User": "alice", "Idempotency-Key": "cap-1"}
    with pytest.raises(requests.ConnectionError):
        requests.post(url, json={"amount": 1000}, headers=headers, timeout=10)
    killed_by = time.monotonic()  # the worker died before this
    state, _, _, _, leased = key_row()
    assert state == "pending" and leased  # committed first, and left leased by the dead worker
    deadline = time.monotonic() + 20
    conflicts = 0
    while True:  # 409 until the dead worker's lease runs out, then the retry resumes
        try:
            retry = requests.post(url, json={"amount": 1000}, headers=headers, timeout=10)
        except requests.ConnectionError:  # gunicorn is replacing the worker
            retry = None
        if retry is not None and retry.status_code != 409:
            break
        if retry is not None:
            assert retry.headers["Retry-After"]
            conflicts += 1
        assert time.monotonic() < deadline, "the lease never ran out"
        time.sleep(0.2)
    # Seen holding the key, or (on a machine too loaded for gunicorn to answer
    # within the lease) the first answer came after it had run out anyway.
    assert conflicts >= 1 or time.monotonic() - killed_by >= CapturePayment.lease, (
        "a retry ran while the dead worker's lease still held the key")
    assert retry.status_code == 201, retry.text
    assert_exactly_once(gateway)


def test_a_duplicate_during_a_running_phase_gets_409_with_retry_after(gateway):
    from django.db import connections
    from rest_framework.test import APIClient

    gateway.control(hold=True)  # the first request's charge waits at the gateway
    answers = {}

    def first():
        answers["first"] = capture(APIClient())
        connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        wait_for(lambda: gateway.stats()["held"] == 1, "the charge phase to be running")
        duplicate = capture(APIClient())
    finally:
        gateway.control(hold=False)
        thread.join(60)
    assert duplicate.status_code == 409
    assert duplicate["Retry-After"] == "1"
    assert duplicate.json()["code"] == "idempotency_key_in_progress"
    assert answers["first"].status_code == 201
    assert_exactly_once(gateway)


def test_a_different_request_with_a_pending_key_is_422(client, gateway, crash):
    client.raise_request_exception = False
    crash("raise", "after_gateway")
    assert capture(client).status_code == 500
    assert capture(client, amount=999).status_code == 422
    assert capture(client).status_code == 201
    assert_exactly_once(gateway)


def test_a_gateway_outage_is_transient_and_the_retry_resumes(client, gateway):
    gateway.control(fail=1)
    failed = capture(client)
    assert failed.status_code == 503 and failed["Retry-After"]
    assert key_row()[:3] == ("pending", None, "payment_created")
    assert count_rows("testapp_payment") == 1  # the local phase stays committed
    retry = capture(client)
    assert retry.status_code == 201
    assert_exactly_once(gateway)


def test_a_declined_card_is_final_stored_and_replayed(client, gateway):
    gateway.control(decline=True)
    declined = capture(client)
    assert declined.status_code == 402
    assert declined.json()["code"] == "card_declined"
    gateway.control(decline=False)
    again = capture(client)
    assert again.status_code == 402 and again["Idempotent-Replayed"] == "true"
    assert gateway.stats()["charges"] == 0
    assert key_row()[:3] == ("failed", 402, "finished")


def test_a_validation_error_from_drf_in_a_phase_is_a_final_400(client, gateway):
    invalid = capture(client, amount=0)
    assert invalid.status_code == 400
    assert "amount" in invalid.json()
    again = capture(client, amount=0)
    assert again.status_code == 400 and again["Idempotent-Replayed"] == "true"
    assert key_row()[:3] == ("failed", 400, "finished")
    assert count_rows("testapp_payment") == 0 and gateway.stats()["calls"] == 0


def run_program(key="cap-1", **kwargs):
    request = IdempotentRequest(tenant_id=1, scope=CapturePayment.scope, key=key,
                                fingerprint="f" * 64, method="POST", path="/x")
    return phases.execute(CapturePayment, request, data={"amount": 1000},
                          kwargs={"order": "A1"}, principal="test", **kwargs)


def lease_ran_out(key="cap-1") -> bool:
    """The key is held by its first owner (token 1), whose lease has run out."""
    with observer() as conn:
        return conn.execute(
            "SELECT lease_token = 1 AND locked_until < clock_timestamp() FROM idempotency_keys"
            " WHERE key = %s", [key]).fetchone() == (True,)


def test_fencing_a_stale_owner_cannot_commit_over_the_new_owner(gateway, monkeypatch):
    from django.db import connections

    stall = threading.Event()
    original = CapturePayment.payment_created
    owners = []

    def stalling(self, ctx):
        owners.append(ctx.attempt)
        result = original(self, ctx)
        if ctx.attempt == 1:
            stall.wait(10)  # owner 1 stalls past its lease, after the gateway answered
        return result

    monkeypatch.setattr(CapturePayment, "payment_created", stalling)
    monkeypatch.setattr(CapturePayment, "lease", 0.5)
    results = {}

    def owner_one():
        results[1] = run_program()
        connections.close_all()

    thread = threading.Thread(target=owner_one)
    thread.start()
    wait_for(lambda: owners == [1], "owner 1 to run its phase")
    wait_for(lease_ran_out, "owner 1's lease to run out")

    def owner_two():
        results[2] = run_program()  # takes over, charges, and waits for owner 1's payment row
        connections.close_all()

    second = threading.Thread(target=owner_two)
    second.start()
    try:
        wait_for(lambda: 2 in results or lock_waits(app_alias()) > 0,
                 "owner 2 to wait for the payment row owner 1 updated")
    finally:
        stall.set()  # owner 1 goes on: its phase's commit is refused, and owner 2 finishes
        thread.join(60)
        second.join(60)
    assert owners == [1, 2]
    assert results[2].outcome is Outcome.EXECUTED and results[2].value.status_code == 201
    assert results[1].outcome is Outcome.IN_PROGRESS  # its late commit was refused
    assert gateway.stats() == {"charges": 1, "calls": 2, "keys": 1, "held": 0}  # one derived key
    with observer() as conn:
        state, token, response = conn.execute(
            "SELECT state, lease_token, response FROM idempotency_keys").fetchone()
    assert (state, token) == ("completed", 2)
    assert response == results[2].value.body
    assert count_rows("testapp_payment") == 1


def test_foreign_keys_are_stable_across_retries_and_unique_per_request(client, gateway, crash):
    client.raise_request_exception = False
    crash("raise", "after_gateway")
    capture(client, key="k-a")
    capture(client, key="k-a")
    capture(client, key="k-b")
    capture(client, key="k-a", user="bob")  # another tenant, same key
    stats = gateway.stats()
    assert stats["calls"] == 4 and stats["keys"] == 3 and stats["charges"] == 3


@pytest.fixture
def another_scope():
    """The capture program under another scope (registered for the test only)."""

    class CaptureElsewhere(CapturePayment):
        scope = "payment.capture-elsewhere"
        completable = False

    yield CaptureElsewhere
    phases._registry.pop(CaptureElsewhere.scope, None)


def charge_keys(gateway) -> list[str]:
    """The foreign keys of the charges the gateway made, in order."""
    return [charge["key"] for charge in requests.get(gateway.url + "/charges", timeout=5).json()]


def test_foreign_keys_differ_per_scope_and_for_a_key_reused_after_it_expired(gateway,
                                                                           another_scope):
    assert run_program(key="k").value.status_code == 201
    request = IdempotentRequest(tenant_id=1, scope=another_scope.scope, key="k",
                                fingerprint="f" * 64, method="POST", path="/x")
    elsewhere = phases.execute(another_scope, request, data={"amount": 1000},
                               kwargs={"order": "A1"}, principal="test")
    assert elsewhere.value.status_code == 201  # the same tenant and key, another scope
    with observer() as conn:  # the first key's TTL runs out; its key may be used again
        conn.execute("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'"
                     " WHERE scope = %s", [CapturePayment.scope])
    reused = run_program(key="k")
    assert reused.outcome is Outcome.EXECUTED and reused.value.status_code == 201
    keys = charge_keys(gateway)
    assert len(keys) == 3 and len(set(keys)) == 3  # three requests, three foreign keys
    assert gateway.stats()["charges"] == 3


def test_phases_refuse_to_run_inside_an_atomic_block(gateway):
    with pytest.raises(RuntimeError, match="non_atomic_requests"), app_atomic():
        run_program()


def test_an_unknown_recovery_point_is_a_clear_error(gateway):
    with tenant_context(1):
        PendingKeyFactory(key="cap-1", request_path="/x", recovery_point="renamed")
    with pytest.raises(phases.UnknownRecoveryPoint, match="renamed"):
        run_program()
    assert key_row()[0] == "pending"


def test_a_pending_key_past_its_ttl_resumes_instead_of_starting_over(client, gateway, crash):
    client.raise_request_exception = False
    crash("raise", "after_gateway")
    assert capture(client).status_code == 500
    with observer() as conn:
        conn.execute("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'")
    retry = capture(client)
    assert retry.status_code == 201
    assert_exactly_once(gateway)  # resumed at payment_created: no second payment row


def test_a_request_refused_in_its_first_phase_leaves_no_pending_key(client, gateway):
    # The program refuses in "started" with a DRF 403 (in UNSTORED_STATUS_CODES):
    # transient, and since nothing was committed yet, nothing is left behind.
    from rest_framework.exceptions import PermissionDenied

    def refuse(self, ctx):
        raise PermissionDenied("not yours")

    original = CapturePayment.started
    CapturePayment.started = refuse
    try:
        refused = capture(client)
    finally:
        CapturePayment.started = original
    assert refused.status_code == 403
    assert key_row() is None
    assert capture(client).status_code == 201
    assert_exactly_once(gateway)


def test_a_transient_failure_after_a_foreign_call_in_the_first_phase_charges_once(gateway):
    # A program whose first phase calls the gateway, then times out: the retry
    # must reuse the same derived key (the key row is kept, not forgotten).
    from idempotency.phases import Finish, Phases, Retry
    from tests.testapp.payments import charge

    calls = []

    class ChargeFirst(Phases):
        scope = "test.charge-first"

        def started(self, ctx):
            answer = charge(500, ctx.foreign_key("charge"))
            calls.append(answer.json()["id"])
            if len(calls) == 1:
                raise Retry("the gateway answered too late")
            return Finish(201, {"charge": answer.json()["id"]})

    request = IdempotentRequest(tenant_id=1, scope=ChargeFirst.scope, key="k",
                                fingerprint="f" * 64, method="POST", path="/x")
    first = phases.execute(ChargeFirst, request)
    assert first.value.status_code == 503
    second = phases.execute(ChargeFirst, request)
    assert second.value.status_code == 201
    assert calls == ["ch_1", "ch_1"]
    assert gateway.stats() == {"charges": 1, "calls": 2, "keys": 1, "held": 0}


def test_a_drf_error_raised_after_writes_rolls_the_phase_back(client, gateway):
    from rest_framework.exceptions import ValidationError

    from tests.testapp.models import Payment

    def write_then_refuse(self, ctx):
        Payment.objects.create(tenant_id=ctx.tenant_id, order_ref="x", amount=1)
        raise ValidationError({"amount": ["too much"]})

    original = CapturePayment.started
    CapturePayment.started = write_then_refuse
    try:
        refused = capture(client)
    finally:
        CapturePayment.started = original
    assert refused.status_code == 400
    assert key_row()[:2] == ("failed", 400)
    assert count_rows("testapp_payment") == 0  # the half-made payment was rolled back
