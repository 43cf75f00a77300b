"""Receivers under faults: no effect is lost, none happens twice.

The scenarios of a fault run of the example shop, replayed with real
processes: a Celery worker (prefork, several pool processes), Redis servers
and RabbitMQ nodes that are restarted, and a database that refuses the
worker's connections. The tests that take the ``broker`` fixture run on both
brokers.
"""

from __future__ import annotations

import io
import os
import re
import signal
import uuid
from contextlib import contextmanager

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connections

from tests.helpers import count_rows, observer
from tests.outbox.support.helpers import (
    FAULT_PROCESS_SETTINGS,
    FAULT_WORKER_APP,
    ORDER_WORKER_APP,
    Broker,
    Process,
    effects,
    publish_many,
    queue_length,
    wait_for,
)
from tests.outbox.support.rig import RabbitServer, RedisServer, Worker

A, B = 1, 2
SETTINGS = {"DJANGO_SETTINGS_MODULE": FAULT_PROCESS_SETTINGS}


def database_now() -> str:
    with observer() as conn:
        return conn.execute("SELECT now()").fetchone()[0].isoformat()


@contextmanager
def app_role_refused():
    """The app role may not connect, and its sessions are cut: the database is
    gone for the worker, as during a restart, while the rest of the server
    (and the observer) keeps running."""
    role = django_settings.DATABASES["default"]["USER"]
    with observer() as conn:
        conn.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT 0')
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
        )
    try:
        yield
    finally:
        with observer() as conn:
            conn.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT -1')
        connections.close_all()  # this process's own sessions were cut too


def relay_once(tmp_path, env: dict[str, str], expected: int, name: str = "relay") -> None:
    """``relay_outbox --once``, which sends ``expected`` messages.

    One run is enough: ``--once`` gives its lease up when it exits (and a
    rewind drops it), so the next run never finds the stream taken.
    """
    proc = Process.manage("relay_outbox", "--once", log=tmp_path / f"{name}.log", env=env)
    try:
        assert proc.popen.wait(120) == 0, proc.output[-3000:]
    finally:
        proc.kill()
    assert re.findall(r"(\d+) message\(s\) sent", proc.output) == [str(expected)], proc.output


# --- scenario (b): the database goes away while the worker runs receivers ------


def test_receivers_that_meet_a_database_outage_retry_and_every_effect_happens_once(
    tmp_path, queue
):
    from outbox.relay import Relay

    ids = publish_many(A, "order.placed", [{"sku": f"b{i}"} for i in range(20)])
    wait_for(lambda: Relay().drain() >= 0 and queue_length(queue) == 20, "20 tasks queued")
    worker = None
    try:
        with app_role_refused():
            worker = Worker(ORDER_WORKER_APP, queue, tmp_path / "worker.log",
                            env={**SETTINGS, "DIO_CELERY_QUEUE": queue}).wait_ready()
            # Every task runs, and meets the outage, before the database returns.
            wait_for(lambda: len(worker.task_ids(r"(?:retry|raised).*OperationalError")) == 20,
                     "every task to meet the outage")
            wait_for(lambda: "(attempt 3 of" in worker.output, "retries to meet it too")
        wait_for(lambda: len(effects()) == 20, "every effect, once the database is back")
        assert worker.stop() == 0
    finally:
        if worker is not None:
            worker.kill()
    assert effects() == {str(i): 1 for i in ids}


# --- scenario (a): the broker forgets its queue ---------------------------------


def test_messages_a_restarted_broker_lost_are_sent_again_by_rewinding_the_relay(tmp_path):
    broker = RedisServer(tmp_path / "redis", persistent=False).start()
    queue = f"dio-faults-{uuid.uuid4().hex[:8]}"
    env = {**SETTINGS, "DIO_REDIS_URL": broker.url, "DIO_CELERY_QUEUE": queue}
    worker = None
    try:
        before = database_now()
        handled = publish_many(A, "order.placed", [{"sku": f"h{i}"} for i in range(10)])
        relay_once(tmp_path, env, 10, "relay-1")
        worker = Worker(ORDER_WORKER_APP, queue, tmp_path / "worker-1.log", env=env).wait_ready()
        wait_for(lambda: len(effects()) == 10, "the first ten handled")
        assert worker.stop() == 0
        # The worker is stopped; 20 more are relayed and wait in the queue...
        lost = publish_many(B, "order.placed", [{"sku": f"l{i}"} for i in range(20)])
        relay_once(tmp_path, env, 20, "relay-2")
        assert broker.queue_length(queue) == 20
        # ...when Redis restarts, keeping nothing: the relay's offset is past them.
        broker.restart()
        assert broker.queue_length(queue) == 0
        # The way back: rewind the relay to before the loss, relay again.
        call_command("relay_outbox", "--rewind-to", before)
        relay_once(tmp_path, env, 30, "relay-3")
        assert broker.queue_length(queue) == 30  # the ten handled ones come again too
        worker = Worker(ORDER_WORKER_APP, queue, tmp_path / "worker-2.log", env=env).wait_ready()
        wait_for(lambda: len(worker.task_ids("succeeded")) == 30, "every delivery handled")
        assert worker.stop() == 0
        assert worker.output.count("already handled") == 10
        assert "(outbox.W105)" in worker.output  # the worker warned: this Redis keeps nothing
    finally:
        if worker is not None:
            worker.kill()
        broker.stop(signal.SIGKILL)
    assert effects() == {str(i): 1 for i in handled + lost}  # the replay added no duplicate


# --- a worker killed mid-task -----------------------------------------------------



@pytest.fixture
def to_receiver(settings, broker, queue):
    """The relay sends to the fault app's ReceiverTask, on this test's queue, on each broker."""
    from tests.outbox.support.fault_worker_app import TASK

    settings.OUTBOX = {**settings.OUTBOX, "CELERY_TASK": TASK}
    return queue


def relay_in_process(count: int, queue: str, broker) -> None:
    from outbox.relay import Relay

    relay = Relay()
    try:
        wait_for(lambda: relay.drain() >= 0 and broker.length(queue) >= count, f"{count} queued")
    finally:
        relay.transport.close()


def test_a_worker_killed_mid_task_gets_the_message_back_and_its_effect_happens_once(
    tmp_path, broker, to_receiver
):
    # On Redis, the fault app's broker looks for messages of dead workers every
    # second and takes them back after a 3-second visibility timeout (an hour by
    # default). RabbitMQ takes them back when the dead worker's connection closes.
    held = tmp_path / "held"
    held.mkdir()
    ids = publish_many(A, "order.placed", [{"sku": "held", "hold": str(held)}])
    ids += publish_many(A, "order.placed", [{"sku": f"k{i}"} for i in range(4)])
    relay_in_process(5, to_receiver, broker)
    env = {**SETTINGS, "DIO_CELERY_QUEUE": to_receiver, "DIO_VISIBILITY_TIMEOUT": "3",
           **broker.env}
    first = Worker(FAULT_WORKER_APP, to_receiver, tmp_path / "worker-1.log", env=env)
    second = None
    try:
        first.wait_ready()
        wait_for(lambda: (held / f"{ids[0]}.pid").exists() and len(effects()) == 4,
                 "the held task to be running, the others done")
        first.kill_group()  # the whole worker, as a crashed host: nothing acknowledges
        assert str(ids[0]) not in effects()  # its transaction died with it
        second = Worker(FAULT_WORKER_APP, to_receiver, tmp_path / "worker-2.log", env=env)
        second.wait_ready()
        wait_for(lambda: len(effects()) == 5, "the held message delivered again")
        # The held message comes back; so may one whose effect committed but whose
        # acknowledgement the kill beat: the receiver skips it (its effect stays once).
        delivered_again = second.task_ids("succeeded")
        assert str(ids[0]) in delivered_again and delivered_again <= {str(i) for i in ids}
        assert second.stop() == 0
    finally:
        first.kill()
        if second is not None:
            second.kill()
    assert effects() == {str(i): 1 for i in ids}


def test_a_pool_process_killed_mid_task_is_rejected_and_run_again_once(
    tmp_path, broker, to_receiver
):
    held = tmp_path / "held"
    held.mkdir()
    ids = publish_many(B, "order.placed", [{"sku": "held", "hold": str(held)}])
    relay_in_process(1, to_receiver, broker)
    # An hour's visibility timeout on Redis, a live connection on RabbitMQ: only
    # reject_on_worker_lost can bring it back soon.
    worker = Worker(FAULT_WORKER_APP, to_receiver, tmp_path / "worker.log",
                    env={**SETTINGS, "DIO_CELERY_QUEUE": to_receiver, **broker.env})
    try:
        worker.wait_ready()
        marker = held / f"{ids[0]}.pid"
        wait_for(marker.exists, "the task to be running")
        os.kill(int(marker.read_text()), signal.SIGKILL)
        wait_for(lambda: len(effects()) == 1, "the task run again")
        assert "WorkerLostError" in worker.output
        assert worker.stop() == 0
    finally:
        worker.kill()
    assert effects() == {str(ids[0]): 1}


# --- concurrent duplicates ----------------------------------------------------------


def test_concurrent_duplicates_in_a_worker_with_several_processes_have_one_effect(
    tmp_path, broker, to_receiver
):
    from outbox.testing import InMemoryTransport, relay_pending
    from outbox.transports import CeleryTransport

    ids = publish_many(A, "order.placed", [{"sku": f"d{i}", "sleep": 0.5} for i in range(8)])
    memory = InMemoryTransport()
    wait_for(lambda: len(relay_pending(memory)) == 8, "the messages read")
    # Each message twice, back to back, as two relays racing would queue them.
    transport = CeleryTransport()
    transport.send([m for m in memory.sent for _ in range(2)])
    transport.close()
    assert broker.length(to_receiver) == 16
    role = django_settings.DATABASES["default"]["USER"]
    waits = []
    worker = Worker(FAULT_WORKER_APP, to_receiver, tmp_path / "worker.log", concurrency=4,
                    env={**SETTINGS, "DIO_CELERY_QUEUE": to_receiver, **broker.env})
    try:
        worker.wait_ready()

        def done() -> bool:
            with observer() as conn:  # a duplicate waiting on the first one's primary key
                waits.append(conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE usename = %s"
                    " AND wait_event_type = 'Lock'", [role]).fetchone()[0])
            return worker.output.count("succeeded in") == 16

        wait_for(done, "every delivery handled")
        assert worker.stop() == 0
    finally:
        worker.kill()
    assert effects() == {str(i): 1 for i in ids}
    assert worker.output.count("already handled") == 8
    assert max(waits) >= 1, "no two deliveries of a message ever ran at once"
    assert len(set(re.findall(r"ForkPoolWorker-(\d+)\] Task", worker.output))) > 1


# --- attempts run out: a dead letter, then a re-drive ---------------------------------


def test_a_receiver_that_keeps_failing_parks_the_message_and_a_redrive_handles_it(
    tmp_path, broker, to_receiver, settings
):
    from tests.outbox.support.fault_worker_app import TASK

    failing = tmp_path / "failing"
    failing.touch()
    ids = publish_many(B, "order.placed", [{"sku": "poison", "fail_while": str(failing)}])
    relay_in_process(1, to_receiver, broker)
    worker = Worker(FAULT_WORKER_APP, to_receiver, tmp_path / "worker.log",
                    env={**SETTINGS, "DIO_CELERY_QUEUE": to_receiver,
                         "DIO_RECEIVER_MAX_ATTEMPTS": "3", **broker.env})
    try:
        worker.wait_ready()
        wait_for(lambda: count_rows("outbox_dead_letters") == 1, "the message parked")
        wait_for(lambda: "gave up on message" in worker.output, "the ERROR log")
        assert worker.stop() == 0
    finally:
        worker.kill()
    log = worker.output
    assert log.count("(attempt 1 of 3)") == 1 and log.count("(attempt 2 of 3)") == 1
    assert re.search(rf"ERROR/\S+\] outbox: task {TASK} gave up on message {ids[0]} of "
                     rf"tenant {B} after 3 attempts and parked it", log)
    with observer() as conn:
        row = conn.execute("SELECT tenant_id, consumer, message_id, attempts, error"
                           " FROM outbox_dead_letters").fetchone()
    assert row[:4] == (B, f"celery:{TASK}", ids[0], 3)
    assert "RuntimeError: failing while" in row[4]
    assert effects() == {} and count_rows("outbox_received") == 0  # every attempt rolled back
    # Listed with the consumers' dead letters; re-driven once the cause is fixed.
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_APP": "tests.outbox.support.fault_worker_app.app"}
    out = io.StringIO()
    call_command("outbox_parked", stdout=out)
    assert f"celery:{TASK}  order.placed" in out.getvalue()
    failing.unlink()
    out = io.StringIO()
    call_command("outbox_parked", "--redrive", stdout=out)
    assert "re-driven: 1 handled, 0 failed again, 0 not found" in out.getvalue()
    assert effects() == {str(ids[0]): 1}
    assert count_rows("outbox_dead_letters") == 0 and count_rows("outbox_received") == 1


def test_a_retry_the_broker_refuses_puts_the_message_back_and_it_is_handled_once(
    tmp_path, queue, settings
):
    """docs/outbox.md: a retry Celery cannot send (the broker is down) puts the message back
    on its queue instead of dropping it. The worker consumes from the suite's Redis and
    publishes (its retries) to a port nobody listens on."""
    from tests.outbox.support.fault_worker_app import TASK

    settings.OUTBOX = {**settings.OUTBOX, "CELERY_TASK": TASK}
    failing = tmp_path / "failing"
    failing.touch()
    ids = publish_many(A, "order.placed", [{"sku": "refused", "fail_while": str(failing)}])
    relay_in_process(1, queue, Broker("redis", django_settings.CELERY_BROKER_URL))
    worker = Worker(FAULT_WORKER_APP, queue, tmp_path / "worker.log",
                    env={**SETTINGS, "DIO_CELERY_QUEUE": queue,
                         "DIO_BROKER_WRITE_URL": "redis://127.0.0.1:1/0"})
    try:
        worker.wait_ready()
        # Its retry refused, the message comes back and is delivered again (attempt 1 again:
        # no retry was ever sent), neither parked nor lost.
        wait_for(lambda: worker.output.count(f"failed on message {ids[0]} of tenant {A}"
                                             " (attempt 1 of") >= 2, "a second delivery")
        assert count_rows("outbox_dead_letters") == 0 and effects() == {}
        failing.unlink()  # the cause fixed: the next delivery goes through
        wait_for(lambda: effects() == {str(ids[0]): 1}, "the message handled")
        assert worker.stop() == 0
    finally:
        worker.kill()
    assert effects() == {str(ids[0]): 1} and count_rows("outbox_received") == 1
    assert count_rows("outbox_dead_letters") == 0


# --- Redis restarted with its queue on disk --------------------------------------------


@pytest.mark.parametrize(("fsync", "stop"), [("always", signal.SIGKILL),
                                             ("everysec", signal.SIGTERM)])
def test_a_redis_with_an_append_only_file_restarted_with_tasks_queued_loses_none(
    tmp_path, fsync, stop
):
    broker = RedisServer(tmp_path / "redis", persistent=True, fsync=fsync).start()
    queue = f"dio-faults-{uuid.uuid4().hex[:8]}"
    env = {**SETTINGS, "DIO_REDIS_URL": broker.url, "DIO_CELERY_QUEUE": queue}
    worker = None
    try:
        ids = publish_many(A, "order.placed", [{"sku": f"p{i}"} for i in range(25)])
        relay_once(tmp_path, env, 25)
        assert broker.queue_length(queue) == 25
        broker.restart(stop)  # SIGKILL: a crash; SIGTERM: a clean restart
        assert broker.queue_length(queue) == 25
        worker = Worker(ORDER_WORKER_APP, queue, tmp_path / "worker.log", env=env).wait_ready()
        wait_for(lambda: len(effects()) == 25, "every queued task handled")
        assert worker.stop() == 0
    finally:
        if worker is not None:
            worker.kill()
        broker.stop(signal.SIGKILL)
    assert effects() == {str(i): 1 for i in ids}
    assert "appendonly" not in worker.output  # the worker found nothing to warn about


# --- RabbitMQ restarted with tasks queued and in flight ----------------------------------


def rabbit_env(server: RabbitServer, queue: str) -> dict[str, str]:
    return {**SETTINGS, "DIO_BROKER_URL": server.url, "DIO_CELERY_QUEUE": queue}


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_rabbitmq_restarted_with_tasks_queued_loses_none(tmp_path, stop):
    """What the relay moved past was confirmed, so it was on disk: a crash keeps it."""
    broker = RabbitServer(tmp_path / "rabbitmq").start()
    queue = f"dio-faults-{uuid.uuid4().hex[:8]}"
    env = rabbit_env(broker, queue)
    worker = None
    try:
        ids = publish_many(A, "order.placed", [{"sku": f"p{i}"} for i in range(25)])
        relay_once(tmp_path, env, 25)
        assert broker.queue_length(queue) == 25
        broker.restart(stop)  # SIGKILL: a crash of the node; SIGTERM: a clean restart
        assert broker.queue_length(queue) == 25
        worker = Worker(ORDER_WORKER_APP, queue, tmp_path / "worker.log", env=env).wait_ready()
        wait_for(lambda: len(effects()) == 25, "every queued task handled")
        assert worker.stop() == 0
    finally:
        if worker is not None:
            worker.kill()
        broker.close()
    assert effects() == {str(i): 1 for i in ids}


def test_rabbitmq_crashing_while_the_relay_and_a_worker_run_loses_nothing_and_runs_each_once(
    tmp_path,
):
    """The node dies (SIGKILL) three times while messages are in every state: being
    published and confirmed (a publisher commits every 20 ms throughout), queued,
    delivered to the worker and not yet acknowledged. Lost 0, effects once."""
    import threading

    broker = RabbitServer(tmp_path / "rabbitmq").start()
    queue = f"dio-faults-{uuid.uuid4().hex[:8]}"
    env = {**rabbit_env(broker, queue), "DIO_RELAY_LEASE": "1"}
    relay = Process.manage("relay_outbox", log=tmp_path / "relay.log", env=env)
    worker = Worker(ORDER_WORKER_APP, queue, tmp_path / "worker.log", env=env, concurrency=2)
    ids: list[uuid.UUID] = []
    done = threading.Event()

    def publish_steadily() -> None:
        try:
            n = 0
            while not done.is_set():
                ids.extend(publish_many(A, "order.placed", [{"sku": f"s{n}"}]))
                n += 1
                done.wait(0.02)
        finally:
            connections.close_all()

    publisher = threading.Thread(target=publish_steadily)
    crashes = 0
    try:
        relay.wait_output("running")
        worker.wait_ready()
        publisher.start()
        for _ in range(3):
            seen = len(effects())
            wait_for(lambda s=seen: len(effects()) >= s + 20, "the worker handling messages")
            broker.restart(signal.SIGKILL)
            crashes += 1
        seen = len(effects())
        wait_for(lambda: len(effects()) >= seen + 20, "messages after the last crash")
        done.set()
        publisher.join(60)
        wait_for(lambda: len(effects()) == len(ids), "every message handled")
        assert relay.stop() == 0
        assert worker.stop() == 0
    finally:
        done.set()
        if publisher.is_alive():
            publisher.join(60)
        relay.kill()
        worker.kill()
        broker.close()
    counts = effects()
    lost = [i for i in ids if str(i) not in counts]
    twice = {m: n for m, n in counts.items() if n != 1}
    print(f"\nRabbitMQ crashed (SIGKILL) {crashes} times; messages: {len(ids)}; lost: "
          f"{len(lost)}; effects duplicated: {len(twice)}; deliveries skipped as already "
          f"handled: {worker.output.count('already handled')}; relay batches sent again: "
          f"{relay.output.count('could not send')}")
    assert crashes == 3 and lost == [] and twice == {}
    assert counts == {str(i): 1 for i in ids}
