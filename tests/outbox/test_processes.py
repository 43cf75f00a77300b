"""The library's processes under crashes, restarts of the database, and SIGTERM.

Each test runs the real commands (manage.py run_consumers / relay_outbox, a
celery worker) as subprocesses against the test database and Redis; those
that take the ``broker`` fixture run on RabbitMQ too.
"""

from __future__ import annotations

import re
import signal
import sys

import pytest
import redis
from django.conf import settings as django_settings

from tenancy.aliases import worker_alias
from tests.helpers import count_rows
from tests.outbox.support.helpers import (
    ORDER_WORKER_APP,
    SUBPROCESS_SETTINGS,
    LoopCut,
    Process,
    drain,
    effects,
    faulty_transport,
    message_position,
    offset,
    orders_by_key,
    pooled,
    publish_many,
    queue_length,
    queued_message_ids,
    wait_for,
)
from tests.outbox.support.recorders import SlowRecorder

A, B = 1, 2

def worker(queue: str, tmp_path, env: dict[str, str] | None = None) -> Process:
    proc = Process(
        [sys.executable, "-m", "celery", "-A", ORDER_WORKER_APP, "worker",
         "-P", "solo", "-Q", queue, "--without-mingle", "--without-gossip",
         "--without-heartbeat", "-l", "info", "-n", f"{queue}@%h"],
        tmp_path / "worker.log",
        env={**SUBPROCESS_SETTINGS, "DIO_CELERY_QUEUE": queue, **(env or {})},
    )
    proc.wait_output("ready.")
    return proc


def handled_count(output: str) -> int:
    found = re.findall(r"(\d+) message\(s\) handled", output)
    assert found, output[-2000:]
    return int(found[-1])


def test_a_consumer_killed_mid_batch_leaves_every_effect_exactly_once(tmp_path):
    marker = tmp_path / "hanging"
    skus = [f"s{i}" for i in range(30)]
    ids = publish_many(A, "order.slow", [{"sku": s} for s in skus])
    proc = Process.manage(
        "run_consumers", "orders-slow", log=tmp_path / "consumer.log",
        env={**SUBPROCESS_SETTINGS, "DIO_HANG_ON": "s25", "DIO_HANG_MARKER": str(marker)},
    )
    try:
        wait_for(marker.exists, "the consumer to hang inside its third batch")
        # batches of 10: s0-s19 committed; s20-s25 written in the open batch
        assert sorted(effects().values()) == [1] * 20
        proc.signal(signal.SIGKILL)
        assert proc.popen.wait(60) == -signal.SIGKILL
    finally:
        proc.kill()
    drain(SlowRecorder(), until=lambda: len(effects()) == 30)
    assert effects() == {str(i): 1 for i in ids}


def test_two_consumer_processes_share_partitions_once_each_in_key_order(tmp_path):
    env = {**SUBPROCESS_SETTINGS, "DIO_HANDLER_DELAY": "0.005"}
    procs = [
        Process.manage("run_consumers", "orders-partitioned", log=tmp_path / f"c{i}.log", env=env)
        for i in range(2)
    ]
    try:
        for proc in procs:
            proc.wait_output("running")
        keys = [f"key{k}" for k in range(8)]
        ids = []
        for seq in range(25):  # one transaction per round, as a stream of updates
            ids += publish_many(B, "order.sequenced", [{"sku": k, "seq": seq} for k in keys],
                                key=lambda p: p["sku"])
        wait_for(lambda: len(effects()) == len(ids), "every message handled")
        codes = [proc.stop() for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert codes == [0, 0]
    assert effects() == {str(i): 1 for i in ids}
    assert orders_by_key() == {k: list(range(25)) for k in keys}
    counts = [handled_count(proc.output) for proc in procs]
    assert sum(counts) == len(ids)
    assert all(counts), counts  # both processes did share the work


@pytest.fixture
def loop_cut():
    """How a loop's connections are cut: directly, or behind a pgbouncer of the test's own."""
    if not pooled(worker_alias()):
        yield LoopCut()
        return
    from tests.pooler import pool_of_one

    with pool_of_one(pool_size=4) as pooler:
        yield LoopCut(pooler)


def lost(output: str) -> int:
    """How many times the loop logged losing the database."""
    return output.count("lost the database")


def test_the_consumer_loop_survives_losing_the_database_and_stops_on_sigterm(tmp_path, loop_cut):
    """Each cut lands inside a batch (the handler waits for the test), so the loop sees it,
    directly and behind pgbouncer alike, and the batch goes again, once."""
    marker = tmp_path / "in-batch"
    proc = Process.manage(
        "run_consumers", "orders-slow", log=tmp_path / "consumer.log",
        env={**SUBPROCESS_SETTINGS, **loop_cut.env, "DIO_HANG_ON": "cut",
             "DIO_HANG_MARKER": str(marker)},
    )
    try:
        proc.wait_output("running")
        ids = []
        for round_ in range(3):
            ids += publish_many(A, "order.slow", [{"sku": "cut"}])
            wait_for(marker.exists, f"round {round_}: the batch open, its handler waiting")
            loop_cut.cut()
            marker.unlink()  # the handler returns; the batch goes on, on a cut connection
            wait_for(lambda n=round_ + 1: lost(proc.output) >= n,
                     f"round {round_}: the loop to see the cut")
            expected = len(ids)
            wait_for(lambda n=expected: len(effects()) == n, f"round {round_} handled")
        ids += publish_many(A, "order.slow", [{"sku": "after"}])
        wait_for(lambda: len(effects()) == len(ids), "the last message handled")
        code = proc.stop()
    finally:
        proc.kill()
    assert code == 0, proc.output[-3000:]
    assert lost(proc.output) == 3, proc.output[-3000:]
    assert effects() == {str(i): 1 for i in ids}
    assert handled_count(proc.output) == len(ids)


def blocked_by(conn, queued: set[int]) -> set[int]:
    """The server sessions waiting for a lock ``conn``'s transaction holds.

    Directly or behind ``queued`` ones (behind pgbouncer, a cut claim's server
    session keeps its place in the row's queue until the row is free). Asked on
    a session of its own: inside a transaction, pg_stat_activity is a snapshot
    taken at its first read.
    """
    from tests.helpers import observer

    with observer() as looking:
        return {row[0] for row in looking.execute(
            "SELECT pid FROM pg_stat_activity WHERE pg_blocking_pids(pid) && %s::int[]",
            [[conn.info.backend_pid, *queued]])}


def test_the_relay_loop_survives_losing_the_database_and_stops_on_sigterm(tmp_path, queue,
                                                                          loop_cut):
    """Each cut lands while the relay's claim of its lease waits for the offset row, which
    the test holds: the loop sees each one, and pauses 1, 2, then 4 s (docs/operations.md)."""
    from outbox import store
    from tests.helpers import observer

    ids = publish_many(A, "order.placed", [{"sku": f"r{i}"} for i in range(3)])
    store.create_offsets(worker_alias(), "relay:default", 1)  # the row the relay claims
    proc = None
    with observer() as holder, holder.transaction():
        holder.execute("SELECT 1 FROM consumer_offsets WHERE name = 'relay:default' FOR UPDATE")
        proc = Process.manage(
            "relay_outbox", log=tmp_path / "relay.log",
            env={**SUBPROCESS_SETTINGS, **loop_cut.env, "DIO_CELERY_QUEUE": queue},
        )
        seen: set[int] = set()
        try:
            for round_ in range(3):
                wait_for(lambda known=frozenset(seen): bool(blocked_by(holder, known) - known),
                         f"round {round_}: the relay's claim to wait for the row")
                seen |= blocked_by(holder, seen)
                loop_cut.cut()
                wait_for(lambda n=round_ + 1: lost(proc.output) >= n,
                         f"round {round_}: the relay to see the cut")
        except BaseException:
            proc.kill()
            raise

    def all_queued() -> bool:
        return {str(i) for i in ids} <= set(queued_message_ids(queue))

    try:
        wait_for(all_queued, "everything relayed once the row is free")
        ids += publish_many(A, "order.placed", [{"sku": "after"}])
        wait_for(all_queued, "the last message relayed")
        wait_for(lambda: offset("relay:default")[0] == message_position(ids[-1]),
                 "the relay's offset at the last message")
        code = proc.stop()
    finally:
        proc.kill()
    assert code == 0, proc.output[-3000:]
    assert lost(proc.output) == 3, proc.output[-3000:]
    # Three failures in a row: the pause doubles, as the loops' schedule says.
    assert re.findall(r"lost the database .*; retrying in ([\d.]+) s", proc.output) == [
        "1.0", "2.0", "4.0"], proc.output[-3000:]
    assert set(queued_message_ids(queue)) == {str(i) for i in ids}
    receiving = worker(queue, tmp_path)
    try:
        wait_for(lambda: queue_length(queue) == 0 and len(effects()) == 4, "the worker")
        assert receiving.stop() == 0
    finally:
        receiving.kill()
    assert effects() == {str(i): 1 for i in ids}


def test_a_relay_killed_between_publish_and_offset_advance_resends_and_the_receiver_deduplicates(
    tmp_path, broker, queue
):
    ids = publish_many(A, "order.placed", [{"sku": f"k{i}"} for i in range(5)])
    env = {**SUBPROCESS_SETTINGS, "DIO_CELERY_QUEUE": queue, "DIO_RELAY_LEASE": "1",
           **broker.env}
    dying = Process.manage(
        "relay_outbox", "--once", "--transport", faulty_transport("DieAfterSend"),
        log=tmp_path / "dying.log", env=env,
    )
    assert dying.popen.wait(120) == -signal.SIGKILL
    dying.kill()
    assert broker.length(queue) == 5  # published (on RabbitMQ: confirmed)...
    assert offset("relay:default")[0] == 0  # ...but the offset never moved
    # A new relay takes over once the dead one's lease has run out.
    again = Process.manage("relay_outbox", log=tmp_path / "relay.log", env=env)
    try:
        wait_for(lambda: broker.length(queue) == 10, "the batch published a second time")
        wait_for(lambda: offset("relay:default")[0] > 0, "the new relay's offset to advance")
        assert again.stop() == 0
    finally:
        again.kill()
    proc = worker(queue, tmp_path, broker.env)
    try:
        wait_for(lambda: broker.length(queue) == 0 and count_rows("outbox_received") == 5,
                 "the worker to drain the queue")
        wait_for(lambda: "succeeded" in proc.output and proc.output.count("succeeded") >= 10,
                 "every delivery to finish")
    finally:
        proc.stop()
    assert effects() == {str(i): 1 for i in ids}  # ten deliveries, five effects
    assert proc.output.count("already handled") == 5


def test_end_to_end_through_a_broker_and_a_celery_worker(tmp_path, broker, queue):
    from outbox.relay import Relay

    proc = worker(queue, tmp_path, broker.env)
    try:
        ids = publish_many(A, "order.placed", [{"sku": f"a{i}"} for i in range(20)])
        ids += publish_many(B, "order.placed", [{"sku": f"b{i}"} for i in range(20)])
        relay = Relay()
        wait_for(lambda: relay.drain() >= 0 and len(effects()) == 40, "the worker's effects")
        relay.transport.close()
    finally:
        assert proc.stop() == 0
    assert effects() == {str(i): 1 for i in ids}
    from tests.helpers import observer

    with observer() as conn:
        rows = conn.execute("SELECT tenant_id, count(*) FROM testapp_order GROUP BY 1").fetchall()
    assert sorted(rows) == [(A, 20), (B, 20)]


def test_celery_transport_publishes_a_batch_to_the_queue_once_and_fires_the_publish_signals(
        queue):
    import json as _json

    from celery.signals import after_task_publish, before_task_publish

    from outbox.relay import Relay

    published: dict[str, list[str]] = {"before": [], "after": []}

    def before(sender=None, headers=None, **kwargs):
        published["before"].append(headers["id"])

    def after(sender=None, headers=None, **kwargs):
        published["after"].append(headers["id"])

    before_task_publish.connect(before, weak=False)
    after_task_publish.connect(after, weak=False)
    try:
        ids = publish_many(A, "order.placed", [{"sku": f"s{i}"} for i in range(3)])
        wait_for(lambda: Relay(name="test").drain() >= 0 and queue_length(queue) == 3,
                 "relayed")
    finally:
        before_task_publish.disconnect(before)
        after_task_publish.disconnect(after)
    client = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    raw = [_json.loads(item) for item in client.lrange(queue, 0, -1)]
    client.close()
    assert sorted(m["headers"]["id"] for m in raw) == sorted(str(i) for i in ids)
    assert {m["headers"]["task"] for m in raw} == {"tests.outbox.receive_order"}
    # Celery's own publish signals, once per message (instrumentation hooks them)
    assert published == {"before": [str(i) for i in ids], "after": [str(i) for i in ids]}
