"""Claims about the library's processes that no test held (issue 9).

Real subprocesses against the test database and a real Redis: a relay whose
broker goes down and comes back, a relay stopped with a batch in flight, and
a Celery worker running every task of the documented beat schedule.
"""

from __future__ import annotations

import json
import re
import signal
import uuid
from pathlib import Path

from django.test import Client

from tests.helpers import count_rows, observer
from tests.outbox.support.helpers import (
    SUBPROCESS_SETTINGS,
    Process,
    effects,
    faulty_transport,
    message_position,
    offset,
    publish_many,
    wait_for,
)
from tests.outbox.support.rig import RedisServer, Worker

A = 1
ROOT = Path(__file__).resolve().parents[2]


def queued_task_ids(broker: RedisServer, queue: str) -> list[str]:
    with broker.client() as client:
        return [json.loads(item)["headers"]["id"] for item in client.lrange(queue, 0, -1)]


# --- docs/outbox.md: if the broker fails, the offset stays put and nothing is skipped --------


def test_a_relay_whose_redis_goes_down_keeps_its_offset_and_sends_everything_when_it_is_back(
    tmp_path,
):
    broker = RedisServer(tmp_path / "redis", persistent=True).start()
    queue = f"dio-claims-{uuid.uuid4().hex[:8]}"
    env = {**SUBPROCESS_SETTINGS, "DIO_REDIS_URL": broker.url, "DIO_CELERY_QUEUE": queue}
    proc = Process.manage("relay_outbox", log=tmp_path / "relay.log", env=env)
    try:
        proc.wait_output("running")
        first = publish_many(A, "order.placed", [{"sku": "before"}])
        wait_for(lambda: broker.queue_length(queue) == 1, "the first message relayed")
        wait_for(lambda: offset("relay:default")[0] == message_position(first[0]),
                 "the relay's offset past the first message")
        broker.stop()  # Redis is down
        during = publish_many(A, "order.placed", [{"sku": f"d{i}"} for i in range(3)])
        wait_for(lambda: proc.output.count("could not send") >= 2,
                 "the relay to meet the outage (twice)")
        assert offset("relay:default")[0] == message_position(first[0])  # nothing skipped
        broker.start()  # the same port, the same append-only file
        wait_for(lambda: broker.queue_length(queue) >= 4, "the batch sent once Redis is back")
        wait_for(lambda: offset("relay:default")[0] == message_position(during[-1]),
                 "the relay's offset past the batch")
        code = proc.stop()
    finally:
        proc.kill()
    try:
        assert code == 0, proc.output[-3000:]
        assert set(queued_task_ids(broker, queue)) == {str(i) for i in first + during}
    finally:
        broker.stop()


# --- docs/operations.md: SIGTERM stops the relay after the batch in flight ---------------------


def test_sigterm_while_the_relay_sends_a_batch_lets_it_finish_and_advance(tmp_path):
    broker = RedisServer(tmp_path / "redis", persistent=False).start()
    queue = f"dio-claims-{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "sending"
    env = {**SUBPROCESS_SETTINGS, "DIO_REDIS_URL": broker.url, "DIO_CELERY_QUEUE": queue,
           "DIO_SEND_MARKER": str(marker), "DIO_SEND_DELAY": "1.5"}
    ids = publish_many(A, "order.placed", [{"sku": f"s{i}"} for i in range(3)])
    proc = Process.manage("relay_outbox", "--transport",
                          faulty_transport("SlowSend"),
                          log=tmp_path / "relay.log", env=env)
    try:
        wait_for(marker.exists, "the relay's batch to be in flight")
        assert broker.queue_length(queue) == 0
        proc.signal(signal.SIGTERM)
        code = proc.popen.wait(60)
    finally:
        proc.kill()
    try:
        assert code == 0, proc.output[-3000:]
        assert sorted(queued_task_ids(broker, queue)) == sorted(str(i) for i in ids)
        assert offset("relay:default")[0] == message_position(ids[-1])
        assert re.findall(r"(\d+) message\(s\) sent", proc.output) == ["3"], proc.output
    finally:
        broker.stop()


# --- docs/operations.md, "Under Celery": the beat schedule's tasks, run by a real worker ------


def message_effects() -> dict[str, int]:
    """Effects per message id (the idempotent POST's order has no note)."""
    return {note: n for note, n in effects().items() if note}


def documented_beat_tasks() -> list[str]:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("### Under Celery"):]
    schedule = section[section.index("CELERY_BEAT_SCHEDULE = {"):]
    schedule = schedule[: schedule.index("```")]
    return re.findall(r'"task": "([\w.]+)"', schedule)


def test_the_documented_schedule_names_six_tasks():
    assert documented_beat_tasks() == [
        "outbox.relay", "outbox.run_consumers", "outbox.reap",
        "idempotency.tasks.reap_expired_keys", "idempotency.tasks.complete_abandoned_keys",
        "outbox.work_parked_jobs",
    ]


def test_every_task_of_the_documented_beat_schedule_runs_in_a_real_worker(tmp_path, settings):
    from tests.outbox.support.order_worker_app import app

    queue = f"dio-claims-beat-{uuid.uuid4().hex[:8]}"
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": queue}
    # Work for each task: messages to relay and to consume, an expired key to reap.
    ids = publish_many(A, "order.placed", [{"sku": f"b{i}"} for i in range(3)])
    answer = Client().post("/orders/", {"sku": "tea", "quantity": 1},
                           content_type="application/json",
                           headers={"X-User": "alice", "Idempotency-Key": "beat"})
    assert answer.status_code == 201
    with observer() as conn:
        conn.execute("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'")
    worker = Worker("tests.outbox.support.beat_worker_app", queue, tmp_path / "worker.log",
                    env={**SUBPROCESS_SETTINGS, "DIO_CELERY_QUEUE": queue}).wait_ready()
    try:
        for name in documented_beat_tasks():
            task_id = app.send_task(name, queue=queue).id
            wait_for(lambda t=task_id, n=name: f"Task {n}[{t}] succeeded" in worker.output
                     or f"Task {n}[{t}] raised" in worker.output, f"{name} to run")
            assert f"Task {name}[{task_id}] succeeded" in worker.output, worker.output[-3000:]
        # outbox.relay sent the messages to this queue, the worker's receiver
        # recorded each; outbox.run_consumers handled each too: two effects apiece.
        wait_for(lambda: message_effects() == {str(i): 2 for i in ids},
                 "the relayed messages received")
    finally:
        assert worker.stop() == 0
        worker.kill()
    assert offset("relay:default")[0] == message_position(ids[-1])
    assert count_rows("idempotency_keys") == 0  # reaped by idempotency.tasks.reap_expired_keys
