"""The relay on RabbitMQ: it moves past a batch only once RabbitMQ confirmed all of it.

The checks (outbox.E110-E112) refuse what cannot give that guarantee; the
transport refuses to publish without confirms or to a queue a restart would
lose; a batch RabbitMQ refuses part of (nack), a message no queue takes
(returned: published with ``mandatory``) and confirms that do not come within
``confirm_timeout`` each fail the batch, which is sent again whole; what the
transport publishes is the message kombu's own ``Producer.publish`` would
publish. On the suite's RabbitMQ (scripts/services run ... rabbitmq); the
withheld confirms through a proxy of the test's own in front of it.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest
from celery import Celery
from django.core import checks
from kombu import Connection, Exchange, Queue

from outbox.celery import check_broker
from outbox.relay import Relay
from outbox.transports import CeleryTransport
from tests.outbox.support.helpers import offset, publish_many, wait_for

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


def test_transient_delivery_by_default_is_an_error(settings, rabbitmq):
    app = rabbit_app(rabbitmq.url)
    app.conf.task_default_delivery_mode = "transient"
    assert check_ids(settings, app) == ["outbox.E112"]
    app.conf.task_default_delivery_mode = "persistent"
    assert check_ids(settings, app) == []


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


def queued_ids(url: str, name: str) -> list[str]:
    """The task ids of the messages in ``name``, oldest first (taking them off the queue)."""
    return [m.headers["id"] for m in _drain(url, name)]


def test_a_message_no_queue_takes_fails_its_batch_and_the_batch_is_sent_again(
    settings, rabbitmq, caplog
):
    """A queue deleted under a relay that already declared it: RabbitMQ returns what the
    relay publishes to it (``mandatory``) instead of confirming it and dropping it."""
    name = "dio-rabbitmq-deleted"
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": name,
                       "CELERY_APP": rabbit_app(rabbitmq.url)}
    rabbitmq.delete(name)
    relay = Relay(name="deleted")
    try:
        first = publish_many(A, "order.placed", [{"sku": "before"}])
        assert relay.drain() == 1  # the relay's connection declared the queue
        assert queued_ids(rabbitmq.url, name) == [str(first[0])]
        rabbitmq.delete(name)  # an operator, a policy...: gone under the relay
        ids = publish_many(A, "order.placed", [{"sku": f"after{i}"} for i in range(3)])
        passed = offset("relay:deleted")[0]
        assert relay.step() is True  # the batch failed: pause, then again
        assert offset("relay:deleted")[0] == passed  # the relay did not move past it
        assert f"RabbitMQ returned a message for '{name}'" in caplog.text, caplog.text
        # The next round's connection declares the queue again: the whole batch goes.
        assert relay.drain() == 3
        assert queued_ids(rabbitmq.url, name) == [str(i) for i in ids]
        assert offset("relay:deleted")[0] > passed
    finally:
        relay.transport.close()
        relay.release()
        rabbitmq.delete(name)


class BrokerProxy:
    """A TCP proxy in front of RabbitMQ that plays a broker gone quiet.

    While :attr:`holding` is set it keeps back everything RabbitMQ sends (its
    confirms among it); while :attr:`deaf` is set it reads nothing more of what
    the client sends, as a node that blocks its publishers (a memory or disk
    alarm), with a receive buffer too small to hide that.
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 5672)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        port = self.listener.getsockname()[1]
        self.url = url.replace(f"{parts.hostname}:{parts.port}", f"127.0.0.1:{port}", 1)
        self.holding = threading.Event()
        self.deaf = threading.Event()
        self.held = 0  # chunks from RabbitMQ kept back
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, self.deaf, False),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.holding, True),
                             daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, stop: threading.Event,
              from_broker: bool) -> None:
        try:
            while True:
                while stop.is_set() and not from_broker:  # read nothing more
                    time.sleep(0.01)
                data = source.recv(4096 if not from_broker else 65536)
                if not data:
                    break
                if stop.is_set() and from_broker:
                    self.held += 1
                    while stop.is_set():
                        time.sleep(0.01)
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.holding.clear()
        self.deaf.clear()
        self.listener.close()
        for end in self.sockets:
            end.close()


def test_confirms_that_do_not_come_within_confirm_timeout_fail_the_batch(
    settings, rabbitmq, caplog
):
    """RabbitMQ stores the batch, but its confirms are held back past ``confirm_timeout``
    (2 s here): the batch fails about 2 s after it was published and the relay keeps its
    offset; once confirms come again the whole batch is sent again (at least once)."""
    name = "dio-rabbitmq-unconfirmed"
    proxy = BrokerProxy(rabbitmq.url)
    app = rabbit_app(proxy.url, queue=Queue(name))
    app.conf.broker_transport_options = {"confirm_publish": True, "confirm_timeout": 2}
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": name, "CELERY_APP": app}
    rabbitmq.delete(name)
    relay = Relay(name="unconfirmed")
    sends: list[float] = []
    send = relay.transport.send

    def timed(messages):
        started = time.monotonic()
        try:
            send(messages)
        finally:
            sends.append(time.monotonic() - started)

    relay.transport.send = timed  # type: ignore[method-assign]
    try:
        publish_many(A, "order.placed", [{"sku": "confirmed"}])
        assert relay.drain() == 1  # connected and confirmed through the proxy
        ids = publish_many(A, "order.placed", [{"sku": f"held{i}"} for i in range(3)])
        passed = offset("relay:unconfirmed")[0]
        proxy.holding.set()
        assert relay.step() is True  # the batch failed: pause, then again
        assert proxy.held > 0  # RabbitMQ did answer: the proxy kept it back
        assert offset("relay:unconfirmed")[0] == passed
        assert "RabbitMQ confirmed 0 of 3 message(s) within 2 s" in caplog.text, caplog.text
        assert 2.0 <= sends[-1] < 3.0, sends
        proxy.holding.clear()
        wait_for(lambda: relay.drain() >= 0 and offset("relay:unconfirmed")[0] > passed,
                 "the batch sent again and confirmed")
        # RabbitMQ had stored the unconfirmed batch: it is there twice, at least once each.
        got = queued_ids(rabbitmq.url, name)
        assert [i for i in got if i in {str(m) for m in ids}] == [str(i) for i in ids] * 2
        # A relay that stops while RabbitMQ answers nothing is not held by it either.
        proxy.holding.set()
        started = time.monotonic()
        closing = threading.Thread(target=relay.transport.close, daemon=True)
        closing.start()
        closing.join(10)
        closed = not closing.is_alive()
        proxy.holding.clear()
        assert closed and time.monotonic() - started < 2.0 + 1.0, "close waited on RabbitMQ"
    finally:
        proxy.close()  # first: a connection whose answers it holds could not close
        relay.transport.close()
        relay.release()
        rabbitmq.delete(name)


def test_a_broker_that_stops_reading_fails_the_batch_within_confirm_timeout(
    settings, rabbitmq, caplog
):
    """A node that blocks its publishers stops reading their connections: a batch larger
    than the sockets' buffers cannot even be written. It fails (py-amqp's connections give
    up on unacknowledged data after a second) instead of holding the relay, and goes again
    once the broker reads."""
    name = "dio-rabbitmq-deaf"
    proxy = BrokerProxy(rabbitmq.url)
    app = rabbit_app(proxy.url, queue=Queue(name))
    app.conf.broker_transport_options = {"confirm_publish": True, "confirm_timeout": 2}
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": name, "CELERY_APP": app}
    rabbitmq.delete(name)
    relay = Relay(name="deaf")
    sends: list[float] = []
    send = relay.transport.send

    def timed(messages):
        started = time.monotonic()
        try:
            send(messages)
        finally:
            sends.append(time.monotonic() - started)

    relay.transport.send = timed  # type: ignore[method-assign]
    try:
        publish_many(A, "order.placed", [{"sku": "read"}])
        assert relay.drain() == 1  # connected through the proxy
        bulk = "x" * 100_000  # 60 messages of 100 kB: more than the sockets buffer
        ids = publish_many(A, "order.placed", [{"sku": f"big{i}", "bulk": bulk}
                                               for i in range(60)])
        passed = offset("relay:deaf")[0]
        proxy.deaf.set()
        stepped: list[bool] = []
        step = threading.Thread(target=lambda: stepped.append(relay.step()), daemon=True)
        step.start()
        step.join(10)
        stuck = step.is_alive()
        proxy.deaf.clear()  # a relay stuck writing (the failure) can finish now
        step.join(30)
        assert not stuck, "the relay waited on a broker that does not read"
        assert stepped == [True]  # the batch failed: pause, then again
        assert offset("relay:deaf")[0] == passed
        assert "could not send 60 message(s)" in caplog.text, caplog.text
        assert sends[-1] < 2.0 + 1.0, sends  # the write gave up within confirm_timeout
        wait_for(lambda: relay.drain() >= 0 and offset("relay:deaf")[0] > passed,
                 "the batch sent again and confirmed")
        got = queued_ids(rabbitmq.url, name)
        assert set(got) >= {str(i) for i in ids}
    finally:
        proxy.close()
        relay.transport.close()
        relay.release()
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
