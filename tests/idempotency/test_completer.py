"""The completer finishes abandoned phases-mode requests, exactly once."""

from __future__ import annotations

import io
import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from idempotency.completer import complete_abandoned_keys
from idempotency.reaper import reap_expired_keys
from tests.helpers import count_rows, observer
from tests.idempotency.test_phases import assert_exactly_once, capture, key_row


@pytest.fixture
def abandoned(client, gateway, crash):
    """A capture whose client gave up after the charge, before the receipt."""
    client.raise_request_exception = False
    crash("raise", "after_gateway")
    assert capture(client).status_code == 500
    assert key_row()[0] == "pending"


def test_the_completer_finishes_an_abandoned_request_once(abandoned, gateway):
    report = complete_abandoned_keys(older_than=0)
    assert (report.found, report.completed, report.failed) == (1, 1, 0)
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


def test_two_completers_at_once_do_not_both_run_it(abandoned, gateway):
    gateway.control(delay=1.0)  # the first completer is still charging when the second looks
    reports = []

    def run():
        reports.append(complete_abandoned_keys(older_than=0))
        connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sum(r.completed for r in reports) == 1
    assert gateway.stats()["calls"] == 2  # the abandoned attempt, then one completer
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
    assert (stuck.recovery_point, stuck.expired, stuck.completable) == (
        "payment_created", True, True)
    out = io.StringIO()
    call_command("reap_idempotency_keys", stdout=out)
    assert "at payment_created" in out.getvalue()
    assert "the completer will finish it" in out.getvalue()
