"""The completer finishes abandoned phases-mode requests, exactly once."""

from __future__ import annotations

import io
import logging
import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from idempotency.completer import complete_abandoned_keys
from idempotency.reaper import reap_expired_keys
from tests.helpers import count_rows, observer, wait_for
from tests.idempotency.test_phases import assert_exactly_once, capture, key_row


@pytest.fixture
def abandoned(client, gateway, crash):
    """A capture whose client gave up after the charge, before the receipt."""
    client.raise_request_exception = False
    crash("raise", "after_gateway")
    assert capture(client).status_code == 500
    assert key_row()[0] == "pending"


def test_the_completer_finishes_an_abandoned_request_once(abandoned, gateway, caplog):
    with caplog.at_level(logging.INFO, logger="idempotency"):
        report = complete_abandoned_keys(older_than=0)
    assert (report.found, report.completed, report.failed) == (1, 1, 0)
    with observer() as conn:
        tenant, scope = conn.execute("SELECT tenant_id, scope FROM idempotency_keys "
                                     "WHERE key = 'cap-1'").fetchone()
    assert (f"completer: finished {tenant}/{scope}/cap-1, abandoned by its client: it answers "
            "201") in caplog.text
    assert_exactly_once(gateway)
    assert complete_abandoned_keys(older_than=0).found == 0


def test_the_client_gets_the_completers_answer(abandoned, client, gateway):
    complete_abandoned_keys(older_than=0)
    replay = capture(client)
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"


def test_a_recent_key_is_left_to_its_client(abandoned, gateway):
    assert complete_abandoned_keys(older_than=3600).found == 0
    assert key_row()[0] == "pending"


def test_a_key_whose_lease_is_live_is_not_touched(abandoned, gateway):
    with observer() as conn:
        conn.execute("UPDATE idempotency_keys SET locked_until = now() + interval '1 minute'")
    assert complete_abandoned_keys(older_than=0).found == 0


def test_a_completer_started_while_another_charges_leaves_the_key_to_it(abandoned, gateway):
    gateway.control(hold=True)  # the first completer's charge waits at the gateway
    reports = []

    def first():
        try:
            reports.append(complete_abandoned_keys(older_than=0))
        finally:
            connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        wait_for(lambda: gateway.stats()["held"] == 1, "the first completer to be charging")
        assert key_row()[4]  # it holds the key's lease
        second = complete_abandoned_keys(older_than=0)  # while the first one holds the key
        assert second.completed == 0 and second.failed == 0
        assert second.found == 0  # its lease is live: not abandoned, left to the first
    finally:
        gateway.control(hold=False)
        thread.join(60)
    assert [r.completed for r in reports] == [1]
    assert gateway.stats()["calls"] == 2  # the abandoned attempt, then the first completer
    assert_exactly_once(gateway)


def test_two_completers_that_found_the_same_key_run_it_once(abandoned, gateway, monkeypatch):
    """Both looked the key up and saw it free; the second takes it over while the first
    waits just before its own take-over: that is a compare-and-set on the key's fencing
    token, so the first, coming late, skips the key instead of running it again."""
    from idempotency import store

    found, go_on = threading.Event(), threading.Event()
    take_over = store.take_over

    def first_waits(*args, **kwargs):
        if threading.current_thread().name == "first":
            found.set()
            go_on.wait(60)  # it saw the key free; the other completer runs meanwhile
        return take_over(*args, **kwargs)

    monkeypatch.setattr(store, "take_over", first_waits)
    reports = {}

    def run(name):
        try:
            reports[name] = complete_abandoned_keys(older_than=0)
        finally:
            connections.close_all()

    first = threading.Thread(target=run, args=("first",), name="first")
    second = threading.Thread(target=run, args=("second",), name="second")
    first.start()
    try:
        assert found.wait(60)
        gateway.control(hold=True)
        second.start()
        wait_for(lambda: gateway.stats()["held"] == 1, "the second completer to be charging")
        go_on.set()  # the first goes on, while the second holds the key
        first.join(60)
        assert not first.is_alive()
    finally:
        go_on.set()
        gateway.control(hold=False)
        first.join(60)
        if second.is_alive() or second.ident:
            second.join(60)
    assert (reports["first"].found, reports["first"].completed, reports["first"].skipped) == (
        1, 0, 1)
    assert (reports["second"].found, reports["second"].completed) == (1, 1)
    assert gateway.stats()["calls"] == 2  # the abandoned attempt, then the second completer
    assert_exactly_once(gateway)


def test_the_command_and_the_task(abandoned, gateway):
    out = io.StringIO()
    call_command("complete_idempotency_keys", "--older-than", "0", "-v", "2", stdout=out)
    assert "completed with 201" in out.getvalue()
    assert "Found 1 abandoned keys: 1 completed, 0 failed again, 0 skipped" in out.getvalue()
    from idempotency.tasks import complete_abandoned_keys as task

    assert task.apply().get()["found"] == 0
    assert_exactly_once(gateway)


def test_the_command_exits_non_zero_when_a_key_fails_again(abandoned, gateway):
    gateway.control(fail=5)
    with pytest.raises(CommandError, match="failed again"):
        call_command("complete_idempotency_keys", "--older-than", "0", stdout=io.StringIO())
    assert key_row()[0] == "pending"


def test_the_reaper_keeps_pending_keys_and_reports_them(abandoned, gateway):
    with observer() as conn:
        conn.execute("UPDATE idempotency_keys SET expires_at = now() - interval '1 hour',"
                     " created_at = now() - interval '2 days'")
    report = reap_expired_keys()
    assert report.deleted == 0 and count_rows("idempotency_keys") == 1
    assert report.stuck_count == 1
    stuck = report.stuck[0]
    assert (stuck.recovery_point, stuck.expired, stuck.scope in report.completable) == (
        "payment_created", True, True)
    out = io.StringIO()
    call_command("reap_idempotency_keys", stdout=out)
    assert "at payment_created" in out.getvalue()
    assert "the completer will finish it" in out.getvalue()


def test_the_command_refuses_an_alias_confined_by_rls_and_completes_nothing(abandoned, gateway):
    """docs/operations.md: each cross-tenant job refuses such an alias, in one line."""
    from tenancy.aliases import app_alias

    calls = gateway.stats()["calls"]
    with pytest.raises(CommandError, match="row-level security") as refused:
        call_command("complete_idempotency_keys", "--older-than", "0",
                     "--database", app_alias(), stdout=io.StringIO())
    assert "\n" not in str(refused.value).strip()
    assert key_row()[0] == "pending" and gateway.stats()["calls"] == calls
