"""outbox_status: lag, parked messages, and the open transactions that published (each
holds back its own tenants' later messages)."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from outbox.observation import status
from tenancy.aliases import system_alias
from tests.helpers import app_role, connect, observer, server_pid, wait_for
from tests.outbox.support.helpers import drain, effects, publish_many, raw_publish
from tests.outbox.support.recorders import OrderRecorder

A, B = 1, 2



@pytest.fixture
def system_reads_all_stats(settings):
    """The system role as docs/outbox.md provisions it: member of pg_read_all_stats."""
    role = settings.DATABASES[system_alias()]["USER"]
    with observer() as conn:
        conn.execute(f"GRANT pg_read_all_stats TO {role}")
    yield
    with observer() as conn:
        conn.execute(f"REVOKE pg_read_all_stats FROM {role}")


def test_status_reports_lag_per_consumer_and_partition():
    publish_many(A, "order.placed", [{"sku": "a"}, {"sku": "b"}])
    drain(OrderRecorder(), until=lambda: len(effects()) == 2)
    publish_many(A, "order.placed", [{"sku": "c"}])
    s = status()
    orders = [r for r in s.readers if r.name == "orders"]
    assert [(r.partition, r.partition_count) for r in orders] == [(0, 1)]
    assert s.messages == 3
    # the third message is pending (or still behind the fence for a moment)
    assert orders[0].behind + s.held_back >= 1
    assert s.oldest_unpassed_age is not None


def test_status_names_the_open_transaction_that_holds_its_tenant_back(system_reads_all_stats,
                                                                      capsys):
    with connect() as blocker, blocker.transaction():
        blocker.execute("SET application_name = 'nightly import'")
        raw_publish(blocker, A, "order.placed", {"sku": "held"})
        pid = server_pid(blocker)
        blocker.execute("SELECT 'the long transaction'")
        publish_many(A, "order.placed", [{"sku": "behind"}])
        publish_many(B, "order.placed", [{"sku": "not held"}])
        s = status()
        assert s.held_back == 1  # "behind" (the held message itself is not committed)
        [publisher] = s.publishers
        assert (publisher.pid, publisher.tenants, publisher.waiting) == (pid, (A,), 1)
        assert (publisher.user, publisher.application) == (app_role(), "nightly import")
        assert "the long transaction" in publisher.query
        assert publisher.age is not None and publisher.since is not None
        call_command("outbox_status")
    out = capsys.readouterr().out
    assert "open transactions that published: 1, holding back 1 committed message(s)" in out
    assert (f"pid {pid} role {app_role()} application nightly import since "
            f"{publisher.since.isoformat(timespec='seconds')}") in out
    assert "tenant(s) 1, 1 waiting" in out


def test_status_counts_parked_messages(monkeypatch, capsys):
    monkeypatch.setattr(OrderRecorder, "max_attempts", 1)
    publish_many(A, "order.placed", [{"sku": "p", "poison": True}])
    from tests.helpers import count_rows

    drain(OrderRecorder(), until=lambda: count_rows("outbox_dead_letters") == 1)
    assert status().parked == {"orders": 1}
    call_command("outbox_status")
    assert "parked: 1 (orders: 1)" in capsys.readouterr().out


def test_status_says_so_when_every_reader_is_up_to_date(capsys):
    call_command("outbox_status")  # no reader has run yet
    assert "not passed by every reader" not in capsys.readouterr().out
    publish_many(A, "order.placed", [{"sku": "a"}])
    drain(OrderRecorder(), until=lambda: len(effects()) == 1)
    assert status().oldest_unpassed_age is None
    call_command("outbox_status")
    out = capsys.readouterr().out
    assert "oldest message not passed by every reader: none, every reader is up to date" in out
    assert "- old" not in out


def test_status_names_every_publisher_in_flight_lowest_bound_first(system_reads_all_stats,
                                                                    capsys):
    from tests.outbox.support.helpers import publish_as

    publish_as(A, "order.placed", {"sku": "committed"})
    with connect() as first, connect() as second, observer() as unrelated:
        unrelated.execute("BEGIN")
        unrelated.execute("CREATE TEMP TABLE t (n int); INSERT INTO t VALUES (1)")  # an xid
        first.execute("BEGIN")
        raw_publish(first, A, "order.placed", {"sku": "first"})
        first_pid = server_pid(first)
        first.execute("SELECT 'the first publisher'")
        second.execute("BEGIN")
        raw_publish(second, B, "order.placed", {"sku": "second"})
        publish_many(A, "order.placed", [{"sku": "behind"}])
        s = status()
        assert [p.pid for p in s.publishers] == [first_pid, server_pid(second)]
        first_publisher = s.publishers[0]
        assert "the first publisher" in first_publisher.query
        assert first_publisher.state == "idle in transaction" and first_publisher.age is not None
        assert s.publishers[0].bound <= s.publishers[1].bound
        assert s.held_back == 1
        call_command("outbox_status")
        first.execute("ROLLBACK")
        assert [p.pid for p in status().publishers] == [server_pid(second)]
        second.execute("ROLLBACK")
        assert status().publishers == [] and status().held_back == 0
    out = capsys.readouterr().out
    assert f"pid {first_pid} role {app_role()}" in out
    assert "open transactions that published: 2, holding back 1 committed message(s)" in out


def test_status_says_the_holders_query_is_hidden_and_what_to_grant(capsys, settings):
    system = settings.DATABASES[system_alias()]["USER"]
    with connect() as blocker, blocker.transaction():
        raw_publish(blocker, A, "order.placed", {"sku": "held"})
        pid = server_pid(blocker)
        [publisher] = status().publishers
        assert publisher.query == "<insufficient privilege>" and publisher.age is None
        call_command("outbox_status")
    out = capsys.readouterr().out
    assert (f"its query, start and state are hidden from {system}: GRANT pg_read_all_stats "
            f"TO {system}") in out
    assert (f"end it: SELECT pg_terminate_backend({pid}); -- rolls its transaction back and "
            f"closes its session; {system} (this command's role) may not: a superuser, a member "
            f"of pg_signal_backend or of {app_role()} may") in out


@pytest.fixture
def system_signals_backends(settings):
    role = settings.DATABASES[system_alias()]["USER"]
    with observer() as conn:
        conn.execute(f"GRANT pg_signal_backend TO {role}")
    yield
    with observer() as conn:
        conn.execute(f"REVOKE pg_signal_backend FROM {role}")


def test_the_statement_status_prints_ends_the_holder_as_the_role_it_names(
        system_signals_backends, capsys):
    from django.db import connections

    blocker = connect()
    try:
        blocker.execute("BEGIN")
        raw_publish(blocker, A, "order.placed", {"sku": "held"})
        pid = server_pid(blocker)
        call_command("outbox_status")
        out = capsys.readouterr().out
        line = next(x for x in out.splitlines() if "end it:" in x)
        assert "(this command's role) may" in line and "may not" not in line
        statement = line.split("end it: ")[1].split(";")[0]
        assert statement == f"SELECT pg_terminate_backend({pid})"
        with connections[system_alias()].cursor() as cursor:
            cursor.execute(statement)
            assert cursor.fetchone() == (True,)
        wait_for(lambda: status().publishers == [], "the holder's end")  # its tenant moves on
    finally:
        blocker.close()
