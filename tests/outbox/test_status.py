"""outbox_status: lag, parked messages, and the transaction holding delivery back."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from outbox.status import status
from tenancy.aliases import system_alias
from tests.helpers import connect, observer, server_pid
from tests.outbox.consumers import OrderRecorder
from tests.outbox.helpers import drain, effects, publish_many, raw_publish

A = 1


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


def test_status_names_the_open_transaction_that_holds_delivery_back(system_reads_all_stats,
                                                                    capsys):
    with connect() as blocker, blocker.transaction():
        raw_publish(blocker, A, "order.placed", {"sku": "held"})
        pid = server_pid(blocker)
        blocker.execute("SELECT 'the long transaction'")
        publish_many(A, "order.placed", [{"sku": "behind"}])
        s = status()
        assert s.held_back == 1  # "behind" (the held message itself is not committed)
        assert s.blocker.pid == pid  # only a publisher of this database can hold it back
        assert "the long transaction" in s.blocker.query
        assert s.blocker.age is not None
        call_command("outbox_status")
    out = capsys.readouterr().out
    assert "held back by an open transaction" in out
    assert f"pid {s.blocker.pid}" in out


def test_status_counts_parked_messages(settings, capsys):
    settings.OUTBOX = {**settings.OUTBOX, "MAX_ATTEMPTS": 1}
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


def test_status_names_the_publisher_with_the_lowest_bound(system_reads_all_stats, capsys):
    from tests.outbox.helpers import publish_as

    publish_as(A, "order.placed", {"sku": "committed"})
    with connect() as first, connect() as second, observer() as unrelated:
        unrelated.execute("BEGIN")
        unrelated.execute("CREATE TEMP TABLE t (n int); INSERT INTO t VALUES (1)")  # an xid
        first.execute("BEGIN")
        raw_publish(first, A, "order.placed", {"sku": "first"})
        first_pid = server_pid(first)
        first.execute("SELECT 'the first publisher'")
        second.execute("BEGIN")
        raw_publish(second, A, "order.placed", {"sku": "second"})
        publish_many(A, "order.placed", [{"sku": "behind"}])
        s = status()
        assert s.blocker.pid == first_pid
        assert "the first publisher" in s.blocker.query
        assert s.blocker.state == "idle in transaction" and s.blocker.age is not None
        assert s.held_back == 1
        assert s.fence == s.blocker.bound + 1
        call_command("outbox_status")
        first.execute("ROLLBACK")
        assert status().blocker.pid == server_pid(second)
        second.execute("ROLLBACK")
        assert status().blocker is None and status().held_back == 0
    out = capsys.readouterr().out
    assert f"pid {first_pid} bound {s.blocker.bound}" in out
    assert "held back by an open transaction that published: 1 message(s)" in out
