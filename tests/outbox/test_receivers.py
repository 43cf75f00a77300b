"""What a receiver does with a failure inside a worker, one decision at a time.

The task runs as a worker would run it (a request that was not called
directly), against a real Celery app and a real broker: kombu's in-memory
transport, which takes the retries, or a Redis port nobody listens on, which
cannot. The tests with a real worker are in test_faults.py.
"""

from __future__ import annotations

import logging
import uuid

import pytest
from celery import Celery
from celery.exceptions import Reject, Retry

from outbox import ReceiverTask, receive, receiver
from outbox.celery import deliver
from outbox.testing import relay_pending
from tests.helpers import count_rows, observer
from tests.outbox.support.helpers import effects, publish_many

A = 1


class Broken(Exception):
    pass


def receiver_task(broker="memory://"):
    app = Celery("dio-receivers", broker=broker, set_as_current=False)
    app.conf.task_publish_retry = False  # an unreachable broker fails at once

    @app.task(base=ReceiverTask, name="receivers.failing", shared=False)
    @receiver("receivers.failing")
    def failing(message):
        raise Broken("the handler failed")

    return app.tasks["receivers.failing"]


def envelope(**fields):
    publish_many(A, "order.placed", [{"sku": "x"}])
    [message] = relay_pending()
    return {**message.envelope(), **fields}


def run_as_worker(task, body, retries):
    """``deliver`` as the worker's run of the task's ``retries``-th retry."""
    task.push_request(id=body["message_id"], args=[body], kwargs={}, retries=retries,
                      called_directly=False, is_eager=False,
                      delivery_info={"exchange": "", "routing_key": "celery"})
    try:
        # What the receiver's wrapper hands deliver(): receive() around the body.
        return deliver(task, body, lambda m: receive(m, task.run.__wrapped__,
                                                     receiver="receivers.failing"))
    finally:
        task.pop_request()


@pytest.fixture(autouse=True)
def _quick(settings):
    settings.OUTBOX = {**settings.OUTBOX, "RECEIVER_RETRY_BACKOFF_MAX": 4.0,
                       "RECEIVER_MAX_ATTEMPTS": 4}


def test_a_failure_is_retried_after_the_librarys_backoff():
    task, body = receiver_task(), envelope()
    for retries, pause in [(0, 1.0), (1, 2.0), (2, 4.0)]:  # 1 s, doubled up to the maximum
        with pytest.raises(Retry) as retried:
            run_as_worker(task, body, retries)
        assert retried.value.when == pause
    assert count_rows("outbox_dead_letters") == 0 and effects() == {}


def test_the_last_attempt_parks_the_message_and_logs_an_error(caplog):
    task, body = receiver_task(), envelope()
    with caplog.at_level(logging.ERROR, logger="outbox"), pytest.raises(Broken):
        run_as_worker(task, body, retries=3)  # the fourth attempt of four
    with observer() as conn:
        row = conn.execute("SELECT tenant_id, consumer, message_id::text, attempts"
                           " FROM outbox_dead_letters").fetchone()
    assert row == (A, "celery:receivers.failing", body["message_id"], 4)
    [record] = caplog.records
    assert (f"task receivers.failing gave up on message {body['message_id']} of tenant {A} "
            "after 4 attempts") in record.getMessage()
    with pytest.raises(Broken):  # delivered once more: parked once
        run_as_worker(task, body, retries=4)
    assert count_rows("outbox_dead_letters") == 1


def test_a_message_that_cannot_be_parked_is_retried_at_the_longest_pause(caplog):
    task = receiver_task()
    body = envelope(tenant_id=2**63)  # no tenant context can be set for it: nor a dead letter
    with caplog.at_level(logging.ERROR, logger="outbox"), pytest.raises(Retry) as retried:
        run_as_worker(task, body, retries=3)
    assert retried.value.when == 4.0
    assert "could not park message" in caplog.text
    assert count_rows("outbox_dead_letters") == 0


def test_a_retry_the_broker_cannot_take_puts_the_message_back_on_its_queue():
    task, body = receiver_task(broker="redis://127.0.0.1:1/0"), envelope()
    with pytest.raises(Reject) as rejected:
        run_as_worker(task, body, retries=0)
    assert rejected.value.requeue is True  # Celery alone would drop it (requeue=False)


def test_something_that_is_not_an_outbox_message_is_refused_at_once(caplog):
    task = receiver_task()
    with caplog.at_level(logging.ERROR, logger="outbox"), pytest.raises(KeyError):
        run_as_worker(task, {"message_id": str(uuid.uuid4())}, retries=0)
    assert "which is not an outbox message" in caplog.text


def test_the_documented_defaults_retry_nine_times_doubling_from_a_second_then_park(settings):
    settings.OUTBOX = {k: v for k, v in settings.OUTBOX.items() if not k.startswith("RECEIVER_")}
    task, body = receiver_task(), envelope()
    pauses = []
    for retries in range(9):
        with pytest.raises(Retry) as retried:
            run_as_worker(task, body, retries)
        pauses.append(retried.value.when)
    assert pauses == [1, 2, 4, 8, 16, 32, 64, 128, 256]  # about 8.5 minutes in all
    with pytest.raises(Broken):
        run_as_worker(task, body, retries=9)  # the tenth attempt: parked
    assert count_rows("outbox_dead_letters") == 1
    unparkable = envelope(tenant_id=2**63)
    with pytest.raises(Retry) as retried:
        run_as_worker(task, unparkable, retries=9)
    assert retried.value.when == 300  # the longest pause: five minutes
