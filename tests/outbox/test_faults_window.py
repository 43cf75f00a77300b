"""What acks_late and the visibility timeout cannot bring back, and what does.

kombu's Redis transport takes a message with BRPOP (Redis removes it from the
list) and records it as unacknowledged with a second command. A worker
killed, or a Redis restarted, between the two leaves the message nowhere: not
queued, not unacknowledged, not received. The soak met this three times in
ten minutes (docs/operations.md, "What a killed Celery worker costs"). The
outbox still has the message: rewinding the relay sends it again, and the
receiver runs it once.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
import redis
from django.conf import settings as django_settings

from tests.outbox.support.helpers import (
    FAULT_PROCESS_SETTINGS,
    FAULT_WORKER_APP,
    effects,
    publish_many,
    wait_for,
)
from tests.outbox.support.rig import Worker

A = 1
SETTINGS = {"DJANGO_SETTINGS_MODULE": FAULT_PROCESS_SETTINGS}
TASK = "tests.faults.receive"  # fault_worker_app.TASK


@pytest.fixture
def to_receiver(settings):
    """The relay sends to the fault app's ReceiverTask, on a queue of this test's own.

    The task's name is written out: importing tests.outbox.support.fault_worker_app here would
    build its Celery app (and set Django up with its settings) in this process.
    """
    name = f"dio-window-{uuid.uuid4().hex[:8]}"
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": name, "CELERY_TASK": TASK}
    yield name
    with redis.Redis.from_url(django_settings.CELERY_BROKER_URL) as client:
        client.delete(name)


def held_by_redis(queue: str, message_id: str) -> bool:
    """Whether the message is in the queue or among the unacknowledged tasks."""
    with redis.Redis.from_url(django_settings.CELERY_BROKER_URL) as client:
        items = client.lrange(queue, 0, -1) + list(client.hvals("unacked"))
    return any(message_id.encode() in item for item in items)


def left_unacknowledged(queue: str) -> None:
    """Take the one message of ``queue`` and record it as unacknowledged now, as kombu's
    Redis transport does for a message a worker took (``QoS.append``): what the broker's
    restore sweep brings back once the visibility timeout has passed."""
    with redis.Redis.from_url(django_settings.CELERY_BROKER_URL) as client:
        [item] = client.lrange(queue, 0, -1)
        client.delete(queue)
        raw = json.loads(item)
        tag = raw["properties"]["delivery_tag"]
        client.hset("unacked", tag, json.dumps([raw, "", queue]))
        client.zadd("unacked_index", {tag: time.time()})


def relay() -> None:
    from outbox.relay import Relay

    relay = Relay()
    try:
        relay.drain()
    finally:
        relay.release()


def test_a_message_taken_by_a_worker_killed_before_recording_it_needs_a_rewind(
    tmp_path, to_receiver
):
    from outbox.relay import rewind

    [message_id] = publish_many(A, "order.placed", [{"sku": "taken"}])
    relay()
    assert held_by_redis(to_receiver, str(message_id))
    taken = tmp_path / "taken"
    env = {**SETTINGS, "DIO_CELERY_QUEUE": to_receiver, "DIO_VISIBILITY_TIMEOUT": "2"}
    first = Worker(FAULT_WORKER_APP, to_receiver, tmp_path / "worker-1.log",
                   env={**env, "DIO_STALL_AFTER_POP": str(taken)})
    second = None
    try:
        wait_for(taken.exists, "the worker to take the message from its list")
        first.kill_group()  # after BRPOP, before kombu records it as unacknowledged
        assert not held_by_redis(to_receiver, str(message_id))
        # A control: a message recorded as unacknowledged after the kill comes back once the
        # visibility timeout (2 s) has passed, at the broker's next restore sweep (1 s).
        [control] = publish_many(A, "order.placed", [{"sku": "control"}])
        relay()
        left_unacknowledged(to_receiver)
        second = Worker(FAULT_WORKER_APP, to_receiver, tmp_path / "worker-2.log", env=env)
        second.wait_ready()
        wait_for(lambda: str(control) in effects(), "the control restored and handled")
        # Nothing brought the taken message back: nothing had recorded it.
        assert str(message_id) not in effects()
        assert not held_by_redis(to_receiver, str(message_id))
        # The runbook: rewind the relay to before the message, and relay again.
        rewind(message_id)
        relay()
        wait_for(lambda: str(message_id) in effects(), "the rewound message handled")
        assert second.stop() == 0
    finally:
        first.kill()
        if second is not None:
            second.kill()
    assert effects() == {str(message_id): 1, str(control): 1}

