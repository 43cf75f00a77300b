"""SIGTERM with a batch in flight: the batch finishes, its position is kept, the process exits 0.

systemd, the demo's supervisor and Celery's own shutdown all stop a process
with SIGTERM, often while it is in the middle of a batch. These run the real
commands as subprocesses and send the signal while a batch is open: the
consumer's handler is sleeping inside its transaction, the relay's transport
is sleeping inside its send to Redis.
"""

from __future__ import annotations

import signal

from tests.outbox.support.helpers import (
    SUBPROCESS_SETTINGS,
    Process,
    drain,
    effects,
    faulty_transport,
    message_position,
    offset,
    publish_many,
    queue_length,
    wait_for,
)
from tests.outbox.support.recorders import SlowRecorder

A = 1

def test_a_consumer_stopped_with_a_batch_in_flight_commits_it_and_exits_0(tmp_path):
    marker = tmp_path / "in-flight"
    ids = publish_many(A, "order.slow", [{"sku": f"s{i}"} for i in range(30)])
    proc = Process.manage(
        "run_consumers", "orders-slow", log=tmp_path / "consumer.log",
        env={**SUBPROCESS_SETTINGS, "DIO_HANG_ON": "s25", "DIO_HANG_MARKER": str(marker),
             "DIO_HANG_SECONDS": "3"},
    )
    try:
        wait_for(marker.exists, "the consumer to pause inside its third batch (s20-s29)")
        proc.signal(signal.SIGTERM)  # s20-s25 written, uncommitted; s26-s29 still to come
        assert proc.popen.wait(60) == 0, proc.output[-3000:]
    finally:
        proc.kill()
    assert "30 message(s) handled" in proc.output
    assert effects() == {str(i): 1 for i in ids}  # the batch in flight finished, once
    assert offset("orders-slow")[0] == message_position(ids[-1])
    assert drain(SlowRecorder()) == 0  # nothing left to do again
    assert effects() == {str(i): 1 for i in ids}


def test_a_relay_stopped_with_a_batch_in_flight_sends_it_once_and_exits_0(tmp_path, queue):
    marker = tmp_path / "in-flight"
    ids = publish_many(A, "order.placed", [{"sku": f"k{i}"} for i in range(5)])
    env = {**SUBPROCESS_SETTINGS, "DIO_CELERY_QUEUE": queue, "DIO_SEND_DELAY": "3",
           "DIO_SEND_MARKER": str(marker)}
    relay = Process.manage("relay_outbox", "--transport", faulty_transport("SlowSend"),
                           log=tmp_path / "relay.log", env=env)
    try:
        wait_for(marker.exists, "the relay to be inside its send")
        assert queue_length(queue) == 0
        relay.signal(signal.SIGTERM)
        assert relay.popen.wait(60) == 0, relay.output[-3000:]
    finally:
        relay.kill()
    assert "relay default: 5 message(s) sent" in relay.output
    assert queue_length(queue) == 5
    assert offset("relay:default")[0] == message_position(ids[-1])
    again = Process.manage("relay_outbox", "--once", log=tmp_path / "again.log", env=env)
    assert again.popen.wait(120) == 0, again.output[-3000:]
    again.kill()
    assert "relay default: 0 message(s) sent" in again.output
    assert queue_length(queue) == 5  # each once: nothing sent again after the stop

