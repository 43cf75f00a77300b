"""The outbox on Django's Tasks framework, with django-tasks-db and its real worker.

The relay (``relay_outbox``, with ``outbox.django_tasks.DjangoTasksTransport``)
enqueues each message as a task; ``manage.py db_worker`` runs the receiver
(tests/outbox/support/tasks_receiver.py, built with ``outbox.django_tasks.receiver_task``)
in its own process. Each test's processes use tests/outbox/support/tasks_process_settings.py;
the last one runs every command with Celery made unimportable.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.core import checks
from django.core.management import call_command
from psycopg import sql

from tests.helpers import PATIENCE, count_rows, observer
from tests.outbox.support.helpers import (
    SUBPROCESS_SETTINGS,
    SUPPORT,
    Process,
    effects,
    faulty_transport,
    publish_many,
    wait_for,
)

pytest.importorskip("django_tasks_db", reason="django-tasks-db is in the test dependency group")

A, B = 1, 2
TASKS = {**SUBPROCESS_SETTINGS, "DJANGO_SETTINGS_MODULE": SUPPORT + ".tasks_process_settings"}
NO_CELERY = {**TASKS, "DJANGO_SETTINGS_MODULE": SUPPORT + ".no_celery_process_settings"}
NO_TASKS_DB = {**TASKS, "DJANGO_SETTINGS_MODULE": SUPPORT + ".no_tasks_db_process_settings"}
TASK_PATH = "tests.outbox.support.tasks_receiver.receive"
TABLE = "django_tasks_database_dbtaskresult"


def manage(tmp_path, *args: str, env: dict[str, str] = TASKS, name: str = "") -> str:
    """Run a manage.py command to its end; its output."""
    log = tmp_path / f"{name or args[0]}-{uuid.uuid4().hex[:6]}.log"
    proc = Process.manage(*args, log=log, env=env)
    try:
        code = proc.popen.wait(180)
    finally:
        proc.kill()
    assert code == 0, proc.output[-3000:]
    return proc.output


@pytest.fixture(scope="module")
def tasks_tables(django_db_setup, tmp_path_factory):
    """django-tasks-db's table in the test database, created by the owner role.

    Its migrations update rows through the router's alias, not the one being
    migrated (a ``RunPython`` without ``using``), so ``migrate --database
    owner`` would wait on its own lock: a router sends them to the owner
    alias for this one command (docs/django-tasks.md). ``migrate`` grants the
    app role the table (``GRANT_PROJECT_TABLES``).
    """
    manage(tmp_path_factory.mktemp("migrate"), "migrate", "django_tasks_database",
           "--database", "owner", env={**TASKS, "DIO_TASKS_MIGRATE": "1"}, name="migrate")


@pytest.fixture(autouse=True)
def _empty_queue(tasks_tables):
    yield
    with observer() as conn:
        conn.execute(f"TRUNCATE {TABLE}")


def results() -> list[dict]:
    """Every task row: status, return value, attempt (from its kwargs), and when it was
    enqueued, deferred to and started (seconds since the epoch, per the database)."""
    with observer() as conn:
        rows = conn.execute(
            f"SELECT status, return_value, args_kwargs, extract(epoch FROM enqueued_at),"
            f" extract(epoch FROM run_after), extract(epoch FROM started_at), task_path, id"
            f" FROM {TABLE} ORDER BY enqueued_at").fetchall()
    return [{"status": s, "value": v, "attempt": a["kwargs"].get("attempt", 1),
             "enqueued": float(e), "run_after": float(r),
             "started": None if b is None else float(b), "path": p, "id": i}
            for s, v, a, e, r, b, p, i in rows]


def relay(tmp_path, expected: int, env: dict[str, str] = TASKS) -> None:
    out = manage(tmp_path, "relay_outbox", "--once", env=env)
    assert re.findall(r"(\d+) message\(s\) sent", out) == [str(expected)], out


def worker(tmp_path, name: str = "worker", env: dict[str, str] = TASKS,
           *extra: str) -> Process:
    return Process.manage("db_worker", "--interval", "0.1", "--no-startup-delay", *extra,
                          log=tmp_path / f"{name}.log", env=env)


def ends_by_itself(proc: Process) -> int:
    """The exit status of a worker started with ``--max-tasks``, once it has run them.

    Not SIGTERM: django-tasks-db's worker leaves its loop on SIGTERM by raising
    SystemExit from the signal handler, wherever the loop is (in its poll's
    query, a commit, Django's connection upkeep), and its exit status then
    depends on where that was: once, under load, it was 1. What these tests
    prove is the effects and the task rows, not that worker's exit on a signal.
    """
    try:
        return proc.popen.wait(PATIENCE)
    finally:
        proc.kill()


# -- delivery, duplicates ------------------------------------------------------------


def test_each_message_is_handled_once_by_a_real_worker_though_delivered_twice(tmp_path):
    ids = publish_many(A, "order.placed", [{"sku": f"t{i}"} for i in range(6)])
    ids += publish_many(B, "order.placed", [{"sku": f"u{i}"} for i in range(4)])
    relay(tmp_path, 10)
    # The broker's at-least-once, played out: the relay sends everything again.
    call_command("relay_outbox", "--rewind-to", str(ids[0]), stdout=io.StringIO())
    relay(tmp_path, 10)
    assert count_rows(TABLE) == 20
    manage(tmp_path, "db_worker", "--batch", "--no-startup-delay", name="db_worker")
    assert effects() == {str(i): 1 for i in ids}
    done = results()
    assert [r["status"] for r in done] == ["SUCCESSFUL"] * 20
    assert sum(r["value"] == {"outcome": "handled"} for r in done) == 10
    assert sum(r["value"] == {"outcome": "duplicate"} for r in done) == 10
    with observer() as conn:  # each ran as its message's tenant
        rows = conn.execute("SELECT tenant_id, count(*) FROM testapp_order GROUP BY 1").fetchall()
    assert sorted(rows) == [(A, 6), (B, 4)]


def test_a_batch_is_enqueued_in_one_transaction_with_the_tasks(tmp_path):
    """All of a batch or nothing: a relay killed after sending, before advancing, left
    every task of its batch; the next relay sends them again and the receiver drops
    the duplicates."""
    ids = publish_many(A, "order.placed", [{"sku": f"k{i}"} for i in range(5)])
    dying = Process.manage(
        "relay_outbox", "--once", "--transport", faulty_transport("DieAfterTasksSend"),
        log=tmp_path / "dying.log", env={**TASKS, "DIO_RELAY_LEASE": "1"})
    assert dying.popen.wait(120) == -signal.SIGKILL
    dying.kill()
    assert count_rows(TABLE) == 5
    wait_for(lambda: count_rows("consumer_offsets", "lease_until < now()") == 1,
             "the dead relay's lease to run out")
    relay(tmp_path, 5, env={**TASKS, "DIO_RELAY_LEASE": "1"})
    manage(tmp_path, "db_worker", "--batch", "--no-startup-delay", name="db_worker")
    assert effects() == {str(i): 1 for i in ids}
    assert sum(r["value"] == {"outcome": "duplicate"} for r in results()) == 5


def test_a_relay_killed_part_way_through_enqueueing_a_batch_leaves_none_of_it(tmp_path):
    ids = publish_many(A, "order.placed", [{"sku": f"p{i}"} for i in range(5)])
    dying = Process.manage(
        "relay_outbox", "--once", "--transport", faulty_transport("DieMidTasksBatch"),
        log=tmp_path / "dying.log", env={**TASKS, "DIO_RELAY_LEASE": "1"})
    assert dying.popen.wait(120) == -signal.SIGKILL
    dying.kill()
    assert count_rows(TABLE) == 0  # two were enqueued, in the transaction that died
    wait_for(lambda: count_rows("consumer_offsets", "lease_until < now()") == 1,
             "the dead relay's lease to run out")
    relay(tmp_path, 5, env={**TASKS, "DIO_RELAY_LEASE": "1"})
    manage(tmp_path, "db_worker", "--batch", "--no-startup-delay", name="db_worker")
    assert effects() == {str(i): 1 for i in ids}


# -- the queue is the worker role's, never the web role's -----------------------------

QUEUE_ATTACKS = {
    "read every tenant's envelopes": f"SELECT args_kwargs FROM {TABLE}",
    "mark another tenant's task done": f"UPDATE {TABLE} SET status = 'SUCCESSFUL'",
    "copy a task": f"INSERT INTO {TABLE} SELECT * FROM {TABLE}",
    "erase a task": f"DELETE FROM {TABLE}",
    "lock the queue": f"SELECT id FROM {TABLE} FOR UPDATE",
}


@pytest.mark.parametrize("attack", list(QUEUE_ATTACKS))
@pytest.mark.parametrize("way", ["direct", "pooled"])
def test_the_web_role_cannot_touch_the_queue_of_every_tenants_envelopes(tmp_path, attack, way,
                                                                       request):
    """Issue 29, item 2: django-tasks-db's queue has no tenant column and no row-level
    security. The relay enqueues on the worker alias and the tasks' worker claims there, so
    the web role needs, and holds, no privilege on it: every statement is refused, as any
    tenant, in either mode, directly or through a pooler."""
    from tests.helpers import as_tenant, connect

    publish_many(A, "order.placed", [{"sku": "queued"}])
    relay(tmp_path, 1)  # tenant A's envelope waits in the queue
    conn = (request.getfixturevalue("pooler").connect("default", autocommit=False)
            if way == "pooled" else connect())
    with conn, as_tenant(conn, B):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(QUEUE_ATTACKS[attack])
    assert [r["status"] for r in results()] == ["READY"]


def test_the_queue_is_routed_to_the_worker_alias_and_granted_the_worker_role_only():
    """Where django-tasks-db enqueues (the relay, a receiver's retry) and its worker claims:
    the router's alias for the queue's model. AppDatabaseRouter sends a model whose table the
    matrix opens to the worker role and not the app role to the worker alias (the queue's, as
    the offsets'); the matrix gives the worker role DML on the queue and the app and system
    roles nothing. (The processes of the tests above enqueue and claim that way.)"""
    from django.db import router

    from outbox.models import ConsumerOffset
    from tenancy.aliases import worker_alias
    from tenancy.privileges import role_names, worker_tables

    assert TABLE in worker_tables() and "consumer_offsets" in worker_tables()
    assert router.db_for_write(ConsumerOffset) == router.db_for_read(ConsumerOffset) == (
        worker_alias())
    names = role_names()
    with observer() as conn:
        held = {kind: conn.execute(
            "SELECT array_agg(p ORDER BY p) FILTER (WHERE has_table_privilege(%s, %s, p))"
            " FROM unnest(array['DELETE', 'INSERT', 'SELECT', 'TRUNCATE', 'UPDATE']) p",
            [names[kind], TABLE]).fetchone()[0] for kind in ("app", "worker", "system")}
    assert held == {"app": None, "worker": ["DELETE", "INSERT", "SELECT", "UPDATE"],
                    "system": None}


def test_the_check_refuses_a_queue_on_the_web_roles_alias(tmp_path):
    """outbox.E124: without AppDatabaseRouter, django-tasks-db's queue is the app alias's; the
    relay would enqueue there as the web role, which has no privilege on it."""
    import subprocess

    from tests.outbox.support.helpers import ROOT

    def check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, text=True,
                              capture_output=True, timeout=120, env={**os.environ, **env})

    assert "outbox.E124" not in check(TASKS).stderr
    refused = check({**TASKS, "DIO_TASKS_NO_ROUTER": "1"})
    assert refused.returncode == 1 and "outbox.E124" in refused.stderr, refused.stderr[-2000:]
    assert "AppDatabaseRouter" in refused.stderr


# -- a worker killed mid-task ----------------------------------------------------------


def test_a_worker_killed_mid_task_gets_its_task_back_and_the_effect_happens_once(tmp_path):
    held = tmp_path / "held"
    held.mkdir()
    ids = publish_many(A, "order.placed", [{"sku": "held", "hold": str(held)}])
    ids += publish_many(A, "order.placed", [{"sku": f"k{i}"} for i in range(4)])
    relay(tmp_path, 5)
    first = worker(tmp_path, "worker-1")
    second = None
    try:
        marker = held / f"{ids[0]}.pid"
        wait_for(marker.exists, "the held task to be running")  # the others wait behind it
        # Past --stalled-after (2 s here) a live receiver still holds its task:
        # nothing is taken from it.
        wait_for(lambda: _running_for() > 2.5, "the held task to run past the stall time")
        assert "0 receiver task(s) made ready again" in manage(
            tmp_path, "requeue_outbox_tasks", "--stalled-after", "2", name="requeue-live")
        first.signal(signal.SIGKILL)  # the worker dies; its task stays RUNNING
        assert first.popen.wait(30) == -signal.SIGKILL
        assert str(ids[0]) not in effects()  # its transaction died with it
        assert [r["status"] for r in results()].count("RUNNING") == 1
        out = manage(tmp_path, "requeue_outbox_tasks", "--stalled-after", "2",
                     name="requeue-dead")
        assert "1 receiver task(s) made ready again" in out
        second = worker(tmp_path, "worker-2", TASKS, "--max-tasks", "5")
        assert ends_by_itself(second) == 0
        assert len(effects()) == 5  # the held message handled again
    finally:
        first.kill()
        if second is not None:
            second.kill()
    assert effects() == {str(i): 1 for i in ids}
    assert [r["status"] for r in results()] == ["SUCCESSFUL"] * 5


def _running_for() -> float:
    with observer() as conn:
        row = conn.execute(f"SELECT extract(epoch FROM now() - started_at) FROM {TABLE}"
                           " WHERE status = 'RUNNING'").fetchone()
    return float(row[0]) if row else 0.0


# -- failures: retried, then parked; a re-drive ----------------------------------------


def test_a_failing_receiver_task_is_retried_then_parked_and_a_redrive_handles_it(
    tmp_path, settings
):
    failing = tmp_path / "failing"
    failing.touch()
    ids = publish_many(B, "order.placed", [{"sku": "poison", "fail_while": str(failing)}])
    relay(tmp_path, 1)
    proc = worker(tmp_path, "worker", {**TASKS, "DIO_RECEIVER_MAX_ATTEMPTS": "3"},
                  "--max-tasks", "3")
    assert ends_by_itself(proc) == 0
    assert count_rows("outbox_dead_letters") == 1  # the message parked
    done = results()
    assert [r["attempt"] for r in done] == [1, 2, 3]
    assert [r["value"]["outcome"] for r in done] == ["retried", "retried", "parked"]
    assert [r["status"] for r in done] == ["SUCCESSFUL"] * 3  # each settled its message
    with observer() as conn:
        row = conn.execute("SELECT tenant_id, consumer, message_id, attempts, error"
                           " FROM outbox_dead_letters").fetchone()
    assert row[:4] == (B, f"tasks:{TASK_PATH}", ids[0], 3)
    assert "RuntimeError: failing while" in row[4]
    assert effects() == {} and count_rows("outbox_received") == 0  # every attempt rolled back
    failing.unlink()
    out = manage(tmp_path, "outbox_parked", "--redrive", name="redrive")
    assert "re-driven: 1 handled, 0 failed again, 0 not found" in out
    assert effects() == {str(ids[0]): 1}
    assert count_rows("outbox_dead_letters") == 0 and count_rows("outbox_received") == 1


def test_a_retry_waits_a_second_doubled_per_attempt_up_to_the_longest_pause(tmp_path):
    """RECEIVER_RETRY_BACKOFF_MAX 3 s, 4 attempts: each retry is enqueued to run 1, 2,
    then 3 s later (django-tasks-db defers: run_after), and the worker waits for it."""
    failing = tmp_path / "failing"
    failing.touch()
    publish_many(B, "order.placed", [{"sku": "poison", "fail_while": str(failing)}])
    relay(tmp_path, 1)
    proc = worker(tmp_path, "worker", {**TASKS, "DIO_RECEIVER_MAX_ATTEMPTS": "4",
                                       "DIO_RECEIVER_RETRY_BACKOFF_MAX": "3"}, "--max-tasks", "4")
    assert ends_by_itself(proc) == 0
    assert count_rows("outbox_dead_letters") == 1  # the message parked
    done = results()
    assert [r["attempt"] for r in done] == [1, 2, 3, 4]
    assert [r["value"]["outcome"] for r in done] == ["retried", "retried", "retried", "parked"]
    deferred = [r["run_after"] - r["enqueued"] for r in done[1:]]
    for pause, expected in zip(deferred, [1.0, 2.0, 3.0], strict=True):
        assert expected - 0.25 <= pause <= expected, deferred  # enqueued just after it is set
    for retry in done[1:]:
        assert retry["started"] >= retry["run_after"]  # the worker waited for it


@contextmanager
def inserts_refused(*tables: str) -> Iterator[None]:
    """No role but each table's owner may INSERT into ``tables`` inside the block."""
    with observer() as conn:
        grants = conn.execute(
            "SELECT c.relname, a.grantee::regrole::text FROM pg_class c,"
            " aclexplode(c.relacl) a WHERE c.relname = ANY(%s) AND a.privilege_type = 'INSERT'"
            " AND a.grantee <> c.relowner", [list(tables)]).fetchall()
        assert {table for table, _ in grants} == set(tables), grants
        for table, role in grants:
            conn.execute(sql.SQL("REVOKE INSERT ON {} FROM {}").format(
                sql.Identifier(table), sql.Identifier(role)))
    try:
        yield
    finally:
        with observer() as conn:
            for table, role in grants:
                conn.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(
                    sql.Identifier(table), sql.Identifier(role)))


def test_a_task_that_cannot_settle_its_message_ends_failed_and_requeue_makes_it_ready(
    tmp_path
):
    """The receiver fails at its last attempt; neither its dead letter nor a retry can be
    written (INSERT refused on both tables): the task ends FAILED, and once the database
    takes writes again requeue_outbox_tasks gives it back to a worker, which handles it."""
    failing = tmp_path / "failing"
    failing.touch()
    ids = publish_many(A, "order.placed", [{"sku": "unsettled", "fail_while": str(failing)}])
    relay(tmp_path, 1)
    with inserts_refused(TABLE, "outbox_dead_letters"):
        out = manage(tmp_path, "db_worker", "--batch", "--no-startup-delay",
                     env={**TASKS, "DIO_RECEIVER_MAX_ATTEMPTS": "1"}, name="db_worker")
    [failed] = results()
    assert failed["status"] == "FAILED", failed
    assert "could not park message" in out, out[-3000:]
    with observer() as conn:
        (traceback,) = conn.execute(f"SELECT traceback FROM {TABLE}").fetchone()
    assert "permission denied" in traceback  # the retry's enqueue, refused
    assert count_rows("outbox_dead_letters") == 0 and effects() == {}
    failing.unlink()
    out = manage(tmp_path, "requeue_outbox_tasks", name="requeue")
    assert "1 receiver task(s) made ready again" in out
    assert [r["status"] for r in results()] == ["READY"]
    manage(tmp_path, "db_worker", "--batch", "--no-startup-delay", name="db_worker-2")
    assert effects() == {str(ids[0]): 1}
    assert [(r["status"], r["value"]) for r in results()] == [
        ("SUCCESSFUL", {"outcome": "handled"})]


# -- requeue_outbox_tasks: its scope, --every, without django-tasks-db ----------------------


def set_task(task_id, **columns: object) -> None:
    """Set a task row's columns (``started_at_ago``: seconds before now)."""
    ago = columns.pop("started_at_ago", None)
    with observer() as conn:
        for column, value in columns.items():
            conn.execute(sql.SQL("UPDATE {} SET {} = %s WHERE id = %s").format(
                sql.Identifier(TABLE), sql.Identifier(column)), [value, task_id])
        if ago is not None:
            conn.execute(sql.SQL("UPDATE {} SET started_at = now() - make_interval(secs => %s)"
                                 " WHERE id = %s").format(sql.Identifier(TABLE)),
                         [ago, task_id])


def test_requeue_touches_only_the_tasks_tasks_task_names(tmp_path):
    """Tasks of another path, RUNNING for an hour or FAILED, stay as they are."""
    publish_many(A, "order.placed", [{"sku": f"q{i}"} for i in range(3)])
    relay(tmp_path, 3)
    other, other_failed, ours = (r["id"] for r in results())
    set_task(other, task_path="tests.elsewhere.task", status="RUNNING", started_at_ago=3600)
    set_task(other_failed, task_path="tests.elsewhere.task", status="FAILED")
    set_task(ours, status="FAILED")
    out = manage(tmp_path, "requeue_outbox_tasks", "--stalled-after", "1", name="requeue")
    assert "1 receiver task(s) made ready again" in out
    statuses = {r["id"]: r["status"] for r in results()}
    assert statuses == {other: "RUNNING", other_failed: "FAILED", ours: "READY"}


def test_requeue_every_looks_again_until_sigterm(tmp_path):
    publish_many(A, "order.placed", [{"sku": f"e{i}"} for i in range(2)])
    relay(tmp_path, 2)
    first, second = (r["id"] for r in results())
    proc = Process.manage("requeue_outbox_tasks", "--every", "0.2",
                          log=tmp_path / "requeue-every.log", env=TASKS)
    try:
        proc.wait_output("looking every 0.2 s")
        set_task(first, status="FAILED")
        wait_for(lambda: proc.output.count("1 receiver task(s) made ready again") == 1,
                 "the first FAILED task made ready")
        set_task(second, status="FAILED")
        wait_for(lambda: proc.output.count("1 receiver task(s) made ready again") == 2,
                 "the second, on a later look")
        assert proc.stop() == 0  # SIGTERM: it ends at once, cleanly
    finally:
        proc.kill()
    assert [r["status"] for r in results()] == ["READY", "READY"]


@pytest.mark.parametrize("every", [[], ["--every", "1"]], ids=["once", "every"])
def test_requeue_without_django_tasks_db_exits_non_zero_saying_so(tmp_path, every):
    proc = Process.manage("requeue_outbox_tasks", *every, log=tmp_path / "requeue.log",
                          env=NO_TASKS_DB)
    try:
        code = proc.popen.wait(120)
    finally:
        proc.kill()
    assert code == 1, proc.output[-2000:]
    assert ("CommandError: requeue_outbox_tasks needs django-tasks-db (django_tasks_db)"
            in proc.output), proc.output[-2000:]
    assert "django_tasks_db modules loaded: none" in proc.output  # the blocker held


# -- signatures --------------------------------------------------------------------------


def test_with_signing_keys_a_forged_task_is_refused_and_a_signed_one_handled(tmp_path):
    keys = {"DIO_SIGNING_KEYS": json.dumps(["tests-only-signing-key-0123456789-abcdef"])}
    ids = publish_many(A, "order.placed", [{"sku": "genuine"}])
    relay(tmp_path, 1, env={**TASKS, **keys})
    with observer() as conn:  # a writer to the queue copies the task, for another tenant
        conn.execute(
            f"INSERT INTO {TABLE} SELECT (jsonb_populate_record(NULL::{TABLE}, to_jsonb(t)"
            " || jsonb_build_object('id', gen_random_uuid(), 'args_kwargs',"
            " jsonb_set(t.args_kwargs, '{args,0,tenant_id}', to_jsonb(%s::int))))).*"
            f" FROM {TABLE} t", [B])
    manage(tmp_path, "db_worker", "--batch", "--no-startup-delay", env={**TASKS, **keys},
           name="db_worker")
    assert effects() == {str(ids[0]): 1}
    values = sorted(json.dumps(r["value"], sort_keys=True) for r in results())
    assert values == [
        '{"outcome": "handled"}',
        '{"outcome": "refused", "reason": "its signature does not match its content"}']
    with observer() as conn:
        assert conn.execute("SELECT tenant_id FROM testapp_order").fetchall() == [(A,)]
    assert count_rows("outbox_dead_letters") == 0


# -- checks --------------------------------------------------------------------------------


def test_the_check_refuses_a_backend_that_keeps_nothing_and_warns_of_one_it_cannot_vouch_for(
    settings,
):
    settings.OUTBOX = {**settings.OUTBOX, "TRANSPORT": "outbox.django_tasks.DjangoTasksTransport",
                       "TASKS_TASK": None}
    assert [m.id for m in checks.run_checks() if m.id == "outbox.E120"] == ["outbox.E120"]
    settings.OUTBOX = {**settings.OUTBOX, "TASKS_TASK": TASK_PATH}
    ids = [m.id for m in checks.run_checks() if (m.id or "").startswith("outbox.")]
    assert ids == ["outbox.W121"]  # this process's TASKS: the immediate backend


def test_manage_py_check_passes_on_django_tasks_db(tmp_path):
    out = manage(tmp_path, "check", name="check")
    assert "no issues" in out


# -- no Celery at all ------------------------------------------------------------------------


def test_a_project_without_celery_runs_the_whole_outbox_on_django_tasks(tmp_path):
    """Celery, kombu and their kin are unimportable in every process
    (tests/outbox/support/no_celery_process_settings.py): the checks, the relay, a worker, the
    consumers, the status, the reaper and the parked list all work."""
    ids = publish_many(A, "order.placed", [{"sku": f"n{i}"} for i in range(3)])
    outputs = [manage(tmp_path, "check", env=NO_CELERY, name="check")]
    outputs.append(manage(tmp_path, "relay_outbox", "--once", env=NO_CELERY))
    outputs.append(manage(tmp_path, "db_worker", "--batch", "--no-startup-delay",
                          env=NO_CELERY, name="db_worker"))
    outputs.append(manage(tmp_path, "run_consumers", "orders", "--once", env=NO_CELERY))
    outputs.append(manage(tmp_path, "outbox_status", env=NO_CELERY))
    outputs.append(manage(tmp_path, "outbox_parked", env=NO_CELERY))
    outputs.append(manage(tmp_path, "reap_outbox", env=NO_CELERY))
    outputs.append(manage(tmp_path, "requeue_outbox_tasks", env=NO_CELERY))
    assert "3 message(s) sent" in outputs[1]
    for out in outputs:
        assert "celery modules loaded: none" in out, out[-2000:]
    # The receiver task's effects, and the in-database consumer's, each once.
    with observer() as conn:
        notes = [n for (n,) in conn.execute("SELECT note FROM testapp_order")]
    assert sorted(notes) == sorted([str(i) for i in ids] * 2)
    # The blocker holds: importing Celery there fails as it would without it.
    probe = Process([sys.executable, "-c", "import django, os; django.setup(); import celery"],
                    tmp_path / "probe.log", env=NO_CELERY)
    assert probe.popen.wait(60) != 0
    probe.kill()
    assert "blocked: no Celery here" in probe.output
