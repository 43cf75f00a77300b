"""outbox_health and the health view: behind, a stale lease, fine; and their exit codes."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from outbox.consumers import ensure_offsets, run_batch
from outbox.relay import Relay
from outbox.testing import InMemoryTransport
from tests.helpers import app_role, observer
from tests.outbox.support.helpers import ROOT, drain, publish_as
from tests.outbox.support.recorders import (
    FAILING,
    OrderRecorder,
    PartitionedRecorder,
    SlowRecorder,
)


def health(*args: str) -> tuple[int, str]:
    """Run the command as a probe would: a process, its exit status and its output."""
    done = subprocess.run([sys.executable, "manage.py", "outbox_health", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def age_messages(seconds: int) -> None:
    with observer() as conn:
        conn.execute("UPDATE outbox_messages SET created_at = now() - make_interval(secs => %s)",
                     [seconds])


def set_lease(until_sql: str) -> None:
    with observer() as conn:
        conn.execute(f"UPDATE consumer_offsets SET lease_until = {until_sql}"
                     " WHERE name = 'relay:default'")



@pytest.fixture
def relay():
    """A relay that has run and still holds its lease (as a running one does)."""
    relay = Relay(InMemoryTransport())
    relay.drain()
    set_lease("now() + interval '1 minute'")
    yield relay
    relay.release()


@pytest.fixture
def every_reader(relay):
    for consumer in (OrderRecorder(), PartitionedRecorder(), SlowRecorder()):
        ensure_offsets(consumer)


def test_fine_exits_0(every_reader):
    code, out = health()
    assert code == 0, out
    assert out.startswith("ok: 7 reader(s)")  # 1 + 4 partitions + 1 consumers, 1 relay


def test_a_consumer_behind_exits_1_naming_it(every_reader):
    publish_as(1, "order.placed", {"sku": "late"})
    age_messages(120)
    code, out = health("--max-lag", "60", "orders")
    assert code == 1
    assert re.search(r"orders\[0\]: 1 message\(s\) not passed, the first 1\d\d s old"
                     r" \(limit 60 s\): the consumer is not keeping up, or not running", out), out
    assert "Traceback" not in out
    assert health("--max-lag", "600", "orders")[0] == 0  # within a looser limit
    drain(OrderRecorder())
    assert health("--max-lag", "60", "orders")[0] == 0


def test_a_head_message_that_keeps_failing_is_named_as_what_holds_the_consumer(every_reader):
    FAILING.add("sour")
    try:
        publish_as(1, "order.placed", {"sku": "sour"})
        for attempt in (1, 2):  # OrderRecorder retries at once (retry_backoff 0)
            result = run_batch(OrderRecorder())
            assert result.failed and not result.parked, (attempt, result)
    finally:
        FAILING.discard("sour")
    age_messages(120)
    code, out = health("--max-lag", "60", "orders")
    assert code == 1, out
    assert re.search(r"orders\[0\]: 1 message\(s\) not passed, the first 1\d\d s old"
                     r" \(limit 60 s\): its head message has failed 2 time\(s\) and is retried",
                     out), out
    assert "not keeping up" not in out  # not the stopped-or-slow explanation


def test_the_relay_behind_is_unhealthy_too(every_reader):
    publish_as(1, "order.placed", {"sku": "late"})
    age_messages(120)
    with pytest.raises(CommandError, match=r"relay:default: 1 message\(s\) not passed"):
        call_command("outbox_health", "relay:default", "--max-lag", "60")


def test_a_tenant_held_back_past_the_limit_is_unhealthy_and_says_who_holds_it(every_reader,
                                                                               client):
    """An open transaction that published holds its tenant's later messages: health sees
    them age, whatever the readers' positions, and names the transaction."""
    from tests.helpers import connect, server_pid
    from tests.outbox.support.helpers import raw_publish

    with connect() as slow:
        slow.execute("SET application_name = 'slow import'")
        slow.execute("BEGIN")
        raw_publish(slow, 1, "order.placed", {"sku": "open"})
        publish_as(1, "order.placed", {"sku": "waiting"})  # committed, of the held tenant
        drain(OrderRecorder())
        code, out = health("--max-lag", "60", "orders")
        assert code == 0, out  # not old yet
        age_messages(120)
        code, out = health("--max-lag", "60", "orders")
        assert code == 1
        assert re.search(
            rf"orders\[0\]: 1 message\(s\) not passed, the first 1\d\d s old \(limit 60 s\): "
            rf"tenant 1 is held back by an open transaction that published for it \(pid "
            rf"{server_pid(slow)}, role {app_role()}, application slow import", out), out
        response = client.get("/healthz/outbox?reader=orders")
        assert response.status_code == 503
        assert "held back by an open transaction" in response.json()["problems"][0]
        slow.execute("COMMIT")
    drain(OrderRecorder())
    assert health("--max-lag", "60", "orders")[0] == 0


def shift_clock(seconds: int) -> None:
    """Every message as if published ``seconds`` earlier (their times relative to each other
    kept: a message its writer dated in the future stays in the future)."""
    with observer() as conn:
        conn.execute("UPDATE outbox_messages SET created_at = created_at"
                     " - make_interval(secs => %s)", [seconds])


FORGED = ("INSERT INTO outbox_messages (tenant_id, message_id, topic, payload, created_at)"
          " VALUES (%s, gen_random_uuid(), 'order.placed', '{}', '2999-01-01')")


def test_a_message_its_writer_dated_in_the_future_hides_no_held_tenant(every_reader, client):
    """Issue 29, item 3: the web role inserts a message dated 2999 (the first its tenant's
    readers have not passed) while an open publisher holds that tenant back. The database
    writes the message's time, so the lag is not negative: health reports the held tenant."""
    from tests.helpers import as_tenant, connect
    from tests.outbox.support.helpers import raw_publish

    with connect() as slow:
        slow.execute("BEGIN")
        raw_publish(slow, 1, "order.placed", {"sku": "open"})
        with connect() as forger:
            with as_tenant(forger, 1):
                forger.execute(FORGED, [1])
                written = forger.execute("SELECT now()").fetchone()[0]
        publish_as(1, "order.placed", {"sku": "waiting"})
        drain(OrderRecorder())
        with observer() as conn:
            assert conn.execute("SELECT max(created_at) FROM outbox_messages").fetchone()[0] \
                <= conn.execute("SELECT now()").fetchone()[0]
            assert conn.execute("SELECT min(created_at) FROM outbox_messages").fetchone()[0] \
                == written
        shift_clock(120)
        code, out = health("--max-lag", "60", "orders")
        assert code == 1, out
        assert re.search(r"orders\[0\]: 2 message\(s\) not passed, the first 1\d\d s old "
                         r"\(limit 60 s\): tenant 1 is held back by an open transaction", out), out
        response = client.get("/healthz/outbox?reader=orders")
        assert response.status_code == 503, response.json()
        slow.execute("ROLLBACK")


def test_a_prepared_transaction_that_holds_delivery_is_a_stall_health_reports(
    every_reader, client, prepared_transactions, settings
):
    """Issue 29, item 4: with the web role alone, a tenant's key held exclusively in one
    session and a publish in another (marked "any tenant"), then PREPARE TRANSACTION: every
    tenant's delivery waits until someone ends it. Health reports it once it is older than
    the limit, whether or not a message waits for it yet, and names its gid."""
    import uuid

    from tests.helpers import as_tenant, connect
    from tests.outbox.support.helpers import raw_publish

    gid = f"dio-stall-{uuid.uuid4().hex[:8]}"
    try:
        with connect(autocommit=True) as holder, connect() as publisher:
            holder.execute("SELECT pg_advisory_lock(1)")
            publisher.execute("BEGIN")
            raw_publish(publisher, 1, "order.placed", {"sku": "frozen"})
            publisher.execute(f"PREPARE TRANSACTION '{gid}'")
        assert health("--max-lag", "60")[0] == 0  # just prepared: no stall yet
        code, out = health("--max-lag", "0")
        assert code == 1, out
        assert re.search(rf"a prepared transaction '{gid}' \(role {app_role()}\) published and "
                         r"has held back every tenant for \d+ s \(limit 0 s\): nothing ends it "
                         rf"but COMMIT PREPARED or ROLLBACK PREPARED '{gid}'", out), out
        with connect() as forger, as_tenant(forger, 2):  # and a message dated 2999 hides nothing
            forger.execute(FORGED, [2])
        code, out = health("--max-lag", "0", "orders")
        assert code == 1, out
        assert "a prepared transaction" in out and "orders[0]: 1 message(s) not passed" in out
        settings.OUTBOX = {**settings.OUTBOX, "HEALTH_MAX_LAG": 0.001}
        response = client.get("/healthz/outbox")
        assert response.status_code == 503
        assert any(p.startswith(f"a prepared transaction '{gid}'")
                   for p in response.json()["problems"]), response.json()
    finally:
        with observer() as conn:
            if conn.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", [gid]).fetchone():
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
    assert "prepared" not in health("--max-lag", "0")[1]


@pytest.mark.parametrize("statement, parameter", [
    ("ALTER ROLE CURRENT_USER SET synchronous_commit = off", "synchronous_commit"),
    ("ALTER ROLE CURRENT_USER SET idle_in_transaction_session_timeout = 0",
     "idle_in_transaction_session_timeout"),
])
def test_a_role_setting_the_web_role_gave_itself_that_breaks_delivery_is_unhealthy(
    every_reader, client, statement, parameter
):
    """Issue 29, item 7: settings the web role gives itself for every later session, where
    delivery rests on them (a commit on disk before the relay sends its message; how long an
    open publisher may hold its tenants), make health unhealthy until they are put back."""
    from tests.helpers import connect

    with connect(autocommit=True) as conn:
        conn.execute(statement)
    try:
        code, out = health()
        assert code == 1, out
        assert f"role {app_role()} (app) has {parameter} = '" in out, out
        assert f'RESET {parameter};' in out
        assert client.get("/healthz/outbox").status_code == 503
    finally:
        with observer() as conn:
            conn.execute(f'ALTER ROLE "{app_role()}" RESET ALL')
    assert health()[0] == 0


def test_a_stale_relay_lease_exits_1(every_reader):
    set_lease("now() - interval '30 seconds'")
    code, out = health("--max-lease-age", "10")
    assert code == 1
    assert re.search(r"relay:default: its lease ran out [3-9]\d s ago \(limit 10 s\)", out), out
    assert health("--max-lease-age", "60")[0] == 0


def test_a_relay_that_stopped_cleanly_holds_no_lease(every_reader, relay):
    relay.release()
    with pytest.raises(CommandError, match="no relay holds the lease"):
        call_command("outbox_health")
    call_command("outbox_health", "--no-relay")  # a consumer pod's probe


def test_a_reader_that_never_ran_is_unhealthy(relay):
    with pytest.raises(CommandError, match=r"orders: has never run"):
        call_command("outbox_health", "orders")


def test_an_unreachable_database_is_one_line_and_exit_1():
    done = subprocess.run(
        [sys.executable, "manage.py", "outbox_health"], cwd=ROOT, capture_output=True, text=True,
        timeout=60, env={**__import__("os").environ, "DIO_PGPORT": "1", "DIO_PGBOUNCER_PORT": "1",
                         "DIO_PGHOST": "127.0.0.1",
                         "DIO_PGSOCKET": ""},
    )
    assert done.returncode == 1
    assert done.stderr.startswith("CommandError: unhealthy: cannot read the outbox:")
    assert "Traceback" not in done.stderr


def test_bad_arguments_are_refused():
    code, out = health("--max-lag", "soon")
    assert code == 2
    assert "'soon' is not a number of seconds" in out


# -- the view --------------------------------------------------------------------


def test_the_view_answers_200_when_fine_and_503_when_behind(client, every_reader):
    response = client.get("/healthz/outbox")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    publish_as(1, "order.placed", {"sku": "late"})
    age_messages(120)
    response = client.get("/healthz/outbox?reader=orders")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unhealthy"
    [problem] = body["problems"]
    assert re.fullmatch(r"orders\[0\]: 1 message\(s\) not passed, the first 1\d\d s old "
                        r"\(limit 60 s\): the consumer is not keeping up, or not running", problem)
    assert body["readers"][0]["behind"] == 1
    assert client.post("/healthz/outbox").status_code == 405


def test_the_view_answers_503_when_the_database_cannot_be_asked(client, settings):
    settings.TENANCY = {**settings.TENANCY, "SYSTEM_DATABASE": "nowhere"}
    response = client.get("/healthz/outbox")
    assert response.status_code == 503
    assert "nowhere" in response.json()["problems"][0]
