"""The relay on RabbitMQ: it moves past a batch only once RabbitMQ confirmed all of it.

The checks (outbox.E110-E112) refuse what cannot give that guarantee; the
transport refuses to publish without confirms or to a queue a restart would
lose; a batch RabbitMQ refuses part of (nack) is sent again whole; what the
transport publishes is the message kombu's own ``Producer.publish`` would
publish. On the suite's RabbitMQ (scripts/services run ... rabbitmq).
"""

from __future__ import annotations

import json

import pytest
from celery import Celery
from django.core import checks
from kombu import Connection, Exchange, Queue

from outbox.celery import check_broker
from outbox.relay import Relay
from outbox.transports import CeleryTransport
from tests.outbox.support.helpers import offset, publish_many

A = 1


def rabbit_app(url: str, *, confirm: bool = True, queue: Queue | None = None) -> Celery:
    app = Celery("dio-rabbitmq-tests", broker=url, set_as_current=False)
    if confirm:
        app.conf.broker_transport_options = {"confirm_publish": True}
    if queue is not None:
        app.conf.task_queues = [queue]
    return app


def check_ids(settings, app) -> list[str]:
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_APP": app}
    return sorted(m.id for m in checks.run_checks() if m.id and m.id.startswith("outbox.E11"))


# -- the checks ---------------------------------------------------------------------


def test_a_rabbitmq_with_confirms_and_durable_queues_passes(settings, rabbitmq):
    assert check_ids(settings, rabbit_app(rabbitmq.url)) == []


def test_a_redis_broker_is_not_checked_for_confirms(settings):
    assert check_ids(settings, Celery("r", broker="redis://127.0.0.1:1/0",
                                      set_as_current=False)) == []


def test_a_rabbitmq_without_publisher_confirms_is_an_error(settings, rabbitmq):
    assert check_ids(settings, rabbit_app(rabbitmq.url, confirm=False)) == ["outbox.E110"]
    assert check_ids(settings, rabbit_app("pyamqp://127.0.0.1:1//", confirm=False)) == [
        "outbox.E110"]


@pytest.mark.parametrize("queue", [
    Queue("dio-transient", durable=False),
    Queue("dio-auto-delete", auto_delete=True),
    Queue("dio-exclusive", exclusive=True),
    Queue("dio-transient-messages", Exchange("dio-transient", delivery_mode="transient")),
], ids=["not durable", "auto-delete", "exclusive", "transient messages"])
def test_a_queue_that_a_restart_loses_is_an_error(settings, rabbitmq, queue):
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": queue.name}
    app = rabbit_app(rabbitmq.url, queue=queue)
    assert check_ids(settings, app) == ["outbox.E111"]
    [problem] = check_broker(app)
    assert queue.name in problem.message


def test_transient_delivery_through_send_task_is_an_error(settings, rabbitmq):
    app = rabbit_app(rabbitmq.url)
    app.conf.task_default_delivery_mode = "transient"
    assert check_ids(settings, app) == []  # the transport's own publish is persistent
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_SEND_TASK": True}
    assert check_ids(settings, app) == ["outbox.E112"]


def test_relay_outbox_does_not_start_with_a_check_error(settings, rabbitmq, tmp_path):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.OUTBOX = {**settings.OUTBOX, "CELERY_APP": rabbit_app(rabbitmq.url, confirm=False)}
    with pytest.raises(SystemCheckError, match="outbox.E110"):
        call_command("relay_outbox", "--once", skip_checks=False)


# -- the transport refuses ----------------------------------------------------------


def test_the_transport_refuses_a_rabbitmq_without_confirms_and_the_offset_stays(
    settings, rabbitmq, queue
):
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_APP": rabbit_app(rabbitmq.url, confirm=False)}
    publish_many(A, "order.placed", [{"sku": "x"}])
    relay = Relay(name="refuses")
    assert relay.step() is True  # a broker failure: it pauses and tries again
    relay.transport.close()
    relay.release()
    assert offset("relay:refuses")[0] == 0
    assert rabbitmq.length(queue) == 0


def test_the_transport_refuses_a_transient_queue(settings, rabbitmq):
    from django_idempotency_outbox.errors import ConfigurationError

    queue = Queue("dio-refused-transient", durable=False)
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": queue.name,
                       "CELERY_APP": rabbit_app(rabbitmq.url, queue=queue)}
    [message] = _messages(1)
    transport = CeleryTransport()
    try:
        with pytest.raises(ConfigurationError, match="outbox.E111"):
            transport.send([message])
    finally:
        transport.close()
    assert rabbitmq.length(queue.name) == 0


# -- confirms -------------------------------------------------------------------------


def test_a_batch_rabbitmq_refuses_part_of_is_not_passed_and_is_sent_again_whole(
    settings, rabbitmq
):
    """A queue that holds 3 messages and refuses more (x-overflow: reject-publish):
    RabbitMQ stores 3 of a batch of 5 and nacks 2. The relay keeps its offset."""
    name = "dio-rabbitmq-bounded"
    bounded = Queue(name, queue_arguments={"x-max-length": 3, "x-overflow": "reject-publish"})
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": name,
                       "CELERY_APP": rabbit_app(rabbitmq.url, queue=bounded)}
    rabbitmq.delete(name)
    try:
        publish_many(A, "order.placed", [{"sku": f"n{i}"} for i in range(5)])
        relay = Relay(name="bounded")
        assert relay.step() is True  # not confirmed: pause, then again
        assert offset("relay:bounded")[0] == 0
        assert rabbitmq.length(name) == 3
        # Room again (the queue drained): the whole batch goes, and the offset moves.
        rabbitmq.delete(name)
        settings.OUTBOX = {**settings.OUTBOX,
                           "CELERY_APP": rabbit_app(rabbitmq.url, queue=Queue(name))}
        relay.transport.close()
        relay.release()
        relay = Relay(name="bounded")
        assert relay.drain() == 5
        relay.transport.close()
        relay.release()
        assert rabbitmq.length(name) == 5
        assert offset("relay:bounded")[0] > 0
    finally:
        rabbitmq.delete(name)


# -- what is published ----------------------------------------------------------------


def _messages(count: int):
    from outbox.testing import InMemoryTransport, relay_pending

    publish_many(A, "order.placed", [{"sku": f"w{i}", "price": "1.10"} for i in range(count)])
    memory = InMemoryTransport()
    relay_pending(memory)
    return memory.sent


def _drain(url: str, name: str) -> list:
    got = []
    with Connection(url) as connection:
        channel = connection.channel()
        while True:
            message = channel.basic_get(name, no_ack=True)
            if message is None:
                return got
            got.append(message)


def test_the_transport_publishes_what_kombus_producer_publishes(settings, rabbitmq):
    """The confirm-batch path against kombu's own ``Producer.publish`` (with
    ``confirm_publish``), message by message: body, headers, properties."""
    from outbox.stream import Message

    first, second = "dio-rabbitmq-wire", "dio-rabbitmq-kombu"
    messages: list[Message] = _messages(3)
    app = rabbit_app(rabbitmq.url)
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_APP": app, "CELERY_QUEUE": first}
    try:
        transport = CeleryTransport()
        transport.send(messages)  # the confirm-batch path
        transport.close()
        wire = _drain(rabbitmq.url, first)
        with app.producer_or_acquire() as producer:  # kombu's path, one confirm each
            for message in messages:
                headers, properties, body, _ = app.amqp.as_task_v2(
                    str(message.message_id), "tests.outbox.receive_order",
                    args=[message.envelope()], kwargs={},
                    argsrepr=f"[<outbox message {message.message_id} {message.topic}>]",
                    kwargsrepr="{}")
                Queue(second)(producer.channel).declare()
                producer.publish(body, exchange="", routing_key=second, serializer="json",
                                 headers=headers, delivery_mode=2, retry=False, **properties)
        kombu = _drain(rabbitmq.url, second)
    finally:
        rabbitmq.delete(first)
        rabbitmq.delete(second)
    assert len(wire) == len(kombu) == 3
    for ours, theirs in zip(wire, kombu, strict=True):
        assert json.loads(ours.body) == json.loads(theirs.body)
        ours_headers = dict(ours.properties.pop("application_headers"))
        theirs_headers = dict(theirs.properties.pop("application_headers"))
        assert ours_headers == theirs_headers
        assert ours.properties == theirs.properties
        assert ours.properties["delivery_mode"] == 2
