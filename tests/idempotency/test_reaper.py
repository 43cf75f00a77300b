"""The reaper: only expired rows, every tenant, bounded batches, one at a time."""

from __future__ import annotations

import io
import re
import threading
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connections, transaction
from django.db.models.functions import Now

from idempotency.exceptions import ReaperBusy
from idempotency.models import IdempotencyKey
from idempotency.reaper import ReaperRefused, reap_expired_keys
from tenancy import tenant_context
from tenancy.aliases import app_alias, system_alias
from tests.helpers import count_rows, observer, wait_for_lock_wait
from tests.idempotency.factories import KeyFactory, PendingKeyFactory
from tests.live import ROOT


def make_keys(tenant_id: int, expired: int, live: int, pending_hours_ago: int = 0) -> None:
    """``expired`` finished keys past their TTL and ``live`` ones of a tenant; with
    ``pending_hours_ago``, a pending key 'stuck' created that long ago."""
    with tenant_context(tenant_id):
        IdempotencyKey.objects.bulk_create([
            *KeyFactory.build_batch(expired, tenant_id=tenant_id, scope="s",
                                    created_at=Now() - timedelta(days=2),
                                    expires_at=Now() - timedelta(days=1)),
            *KeyFactory.build_batch(live, tenant_id=tenant_id, scope="s"),
        ])
        if pending_hours_ago:
            PendingKeyFactory(tenant_id=tenant_id, scope="pay", key="stuck",
                              created_at=Now() - timedelta(hours=pending_hours_ago))


def test_it_deletes_only_expired_rows_of_every_tenant_in_batches():
    make_keys(1, expired=25, live=5)
    make_keys(2, expired=25, live=5)
    make_keys(3, expired=0, live=5)
    lines: list[str] = []
    report = reap_expired_keys(batch_size=10, progress=lines.append)
    assert report.deleted == 50
    assert report.batches == 6  # 10 + 10 + 5 per tenant
    assert report.tenants == 2
    assert 0 < report.longest_batch_seconds <= report.seconds
    assert len(lines) == 6
    assert count_rows("idempotency_keys") == 15
    assert count_rows("idempotency_keys", "expires_at <= now()") == 0


def test_a_dry_run_counts_and_deletes_nothing():
    make_keys(1, expired=7, live=3)
    report = reap_expired_keys(dry_run=True)
    assert (report.deleted, report.batches) == (7, 0)
    assert count_rows("idempotency_keys") == 10


def test_it_refuses_an_alias_confined_by_rls():
    make_keys(1, expired=3, live=0)
    with pytest.raises(ReaperRefused, match="row-level security"):
        reap_expired_keys(using=app_alias())
    assert count_rows("idempotency_keys") == 3


def test_it_refuses_an_unknown_alias():
    with pytest.raises(Exception, match="not configured"):
        reap_expired_keys(using="nope")


def _hold_lease(owner: str, interval: str) -> None:
    with observer() as conn:
        conn.execute(
            "UPDATE idempotency_leases SET owner = %s, until = now() + %s::interval"
            " WHERE name = 'reaper'", [owner, interval],
        )


def test_a_second_reaper_refuses_loudly_while_one_holds_the_lease():
    make_keys(1, expired=5, live=0)
    _hold_lease("host:1:other", "1 minute")
    with pytest.raises(ReaperBusy, match=r"not run: another reaper \(host:1:other\) holds the "
                       r"lease until \d{4}-"):
        reap_expired_keys()
    assert count_rows("idempotency_keys") == 5
    with pytest.raises(CommandError, match="another reaper"):
        call_command("reap_idempotency_keys")


def test_a_lease_left_by_a_dead_reaper_runs_out():
    make_keys(1, expired=5, live=0)
    _hold_lease("host:1:dead", "-1 second")
    assert reap_expired_keys().deleted == 5
    with observer() as conn:
        assert conn.execute(
            "SELECT owner, until FROM idempotency_leases WHERE name = 'reaper'"
        ).fetchone() == ("", None)  # released at the end


def test_reapers_run_one_after_another_on_a_pooled_system_alias():
    # Behind pgbouncer (DIO_POOLED=app,system) a session advisory lock stayed on
    # a pooled server session and every later run stepped aside; the lease row
    # is released by a statement of its own, whichever server session runs it.
    make_keys(1, expired=5, live=0)
    assert reap_expired_keys().deleted == 5
    make_keys(2, expired=7, live=0)
    assert reap_expired_keys().deleted == 7


def test_a_reaper_started_while_another_is_mid_run_refuses_naming_it():
    make_keys(1, expired=3000, live=10)
    make_keys(2, expired=3000, live=10)
    first_batch, release = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def gate(line: str) -> None:  # the first reaper stops after its first batch
        if not first_batch.is_set():
            first_batch.set()
            release.wait(60)

    def first() -> None:
        try:
            outcome["report"] = reap_expired_keys(batch_size=50, progress=gate)
        except Exception as exc:  # reported below
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert first_batch.wait(60), "the first reaper never finished a batch"
        with observer() as conn:
            owner = conn.execute(
                "SELECT owner FROM idempotency_leases WHERE name = 'reaper'").fetchone()[0]
        assert owner  # held by the first reaper, mid-run
        with pytest.raises(ReaperBusy, match=f"another reaper \\({re.escape(owner)}\\)"):
            reap_expired_keys(batch_size=50)
        assert count_rows("idempotency_keys") == 6020 - 50  # the second deleted nothing
    finally:
        release.set()
        thread.join(60)
    assert not thread.is_alive() and "error" not in outcome, outcome
    assert outcome["report"].deleted == 6000
    assert count_rows("idempotency_keys") == 20


def test_two_sessions_claiming_the_lease_at_once_take_turns_and_the_second_finds_it_held():
    """The claim is one statement on the lease row: the second waits for the first's row
    lock, then sees the lease held (and takes nothing)."""
    from tenancy.leases import Lease

    def claim_lease(alias: str, owner: str) -> tuple[object, ...] | None:
        return Lease("idempotency", "reaper", alias, owner).claim(60)

    claimed = threading.Event()
    commit = threading.Event()
    second: dict[str, object] = {}
    alias = system_alias()

    def first_claim() -> None:
        try:
            with transaction.atomic(using=alias):
                assert claim_lease(alias, "first") is not None
                claimed.set()
                commit.wait(60)  # the claim is made, not committed yet
        finally:
            connections.close_all()

    def second_claim() -> None:
        try:
            second["claimed"] = claim_lease(alias, "second")
        finally:
            connections.close_all()

    one = threading.Thread(target=first_claim)
    one.start()
    assert claimed.wait(60)
    two = threading.Thread(target=second_claim)
    two.start()
    try:
        wait_for_lock_wait(alias)  # the second claim waits for the first's row lock
        assert "claimed" not in second
    finally:
        commit.set()
        one.join(60)
        two.join(60)
    assert second["claimed"] is None
    with observer() as conn:
        assert conn.execute(
            "SELECT owner FROM idempotency_leases WHERE name = 'reaper'").fetchone()[0] == "first"


def test_it_reports_keys_stuck_unfinished():
    make_keys(1, expired=0, live=1, pending_hours_ago=3)
    report = reap_expired_keys()
    assert report.stuck_count == 1
    assert report.stuck[0].key == "stuck"


def test_the_command_prints_what_it_did():
    make_keys(1, expired=4, live=1, pending_hours_ago=2)
    out = io.StringIO()
    call_command("reap_idempotency_keys", "--batch-size", "3", stdout=out)
    text = out.getvalue()
    assert "Deleted 4 expired idempotency keys of 1 tenants in 2 batches" in text
    assert "1 keys are stuck unfinished" in text and "'stuck'" in text


def test_the_command_dry_run_and_verbose_progress():
    make_keys(1, expired=4, live=1)
    out = io.StringIO()
    call_command("reap_idempotency_keys", "--dry-run", stdout=out)
    assert "Would delete 4 expired" in out.getvalue()
    out = io.StringIO()
    call_command("reap_idempotency_keys", "--batch-size", "2", "-v", "2", stdout=out)
    assert out.getvalue().count("tenant 1: deleted 2") == 2


def test_the_command_fails_clearly_on_the_app_alias():
    with pytest.raises(CommandError, match="row-level security"):
        call_command("reap_idempotency_keys", "--database", app_alias())


def test_the_command_rejects_a_bad_batch_size():
    with pytest.raises(CommandError, match="batch-size"):
        call_command("reap_idempotency_keys", "--batch-size", "0")


def test_the_celery_task_runs_the_same_job():
    from idempotency.tasks import reap_expired_keys as task

    make_keys(2, expired=6, live=1)
    result = task.apply(kwargs={"batch_size": 4}).get()
    assert result["deleted"] == 6 and result["batches"] == 2
    assert count_rows("idempotency_keys") == 1


def test_the_celery_task_fails_while_another_reaper_holds_the_lease():
    # A scheduler must see a failed task, not a report of zero keys reaped.
    from idempotency.tasks import reap_expired_keys as task

    make_keys(2, expired=6, live=0)
    _hold_lease("host:2:other", "1 minute")
    result = task.apply()
    assert result.failed()
    assert isinstance(result.result, ReaperBusy)
    assert "holds the lease until" in str(result.result)
    assert count_rows("idempotency_keys") == 6


def test_the_reaper_pauses_between_batches_and_commits_them_asynchronously(monkeypatch):
    from idempotency import reaper

    make_keys(1, expired=10, live=0)
    pauses = []
    monkeypatch.setattr(reaper.time, "sleep", pauses.append)
    statements = []

    def capture(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connections[system_alias()].execute_wrapper(capture):
        report = reap_expired_keys(batch_size=4, pause=0.25)
        with connections[system_alias()].cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            session_value = cursor.fetchone()[0]
    assert report.batches == 3
    assert pauses == [0.25, 0.25]  # between batches, not before the first
    async_batches = [s for s in statements if s == "SET LOCAL synchronous_commit = off"]
    assert len(async_batches) == 3  # one per batch (4 + 4 + 2 rows)
    assert session_value == "on"  # SET LOCAL: the session itself is untouched


def test_the_table_is_vacuumed_as_docs_scaling_recommends():
    """Migration 0010 sets on ``idempotency_keys`` the autovacuum settings that
    docs/scaling.md measures and recommends, no more and no fewer."""
    page = (ROOT / "docs" / "scaling.md").read_text()
    block = page[page.index("ALTER TABLE idempotency_keys SET ("):]
    documented = set(re.findall(r"(autovacuum_\w+ = [\d.]+)", block[: block.index(");")]))
    with observer() as conn:
        (options,) = conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'idempotency_keys'::regclass"
        ).fetchone()
    assert documented and {o.replace("=", " = ") for o in options} == documented
