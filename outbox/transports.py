"""Where the relay sends messages: Celery (default), a log, or memory (tests).

A transport's ``send`` either delivers the whole batch or raises. The relay
advances its offset only after ``send`` returned, so a batch that failed
halfway is sent again whole: delivery to the broker is at-least-once, and
receivers de-duplicate by message id (:mod:`outbox.receivers`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

from django.utils.module_loading import import_string

from django_idempotency_outbox import tracing
from django_idempotency_outbox.errors import ConfigurationError
from outbox.conf import outbox_settings, task_for
from outbox.stream import Envelope, Message

logger = logging.getLogger("outbox.transport")


class Transport:
    """Base class. Subclasses implement :meth:`send`.

    The relay hands :meth:`send` each batch as :class:`~outbox.stream.Message`
    objects; a transport that sends JSON sets :attr:`reads_envelopes`, and
    gets :class:`~outbox.stream.Envelope` objects instead: each message's
    envelope as the JSON text PostgreSQL built, never decoded on the way.
    """

    #: True: the relay reads each message as its envelope's JSON (an Envelope).
    reads_envelopes = False

    def send(self, messages: Sequence[Message]) -> None:
        """Deliver every message of ``messages`` or raise."""
        raise NotImplementedError

    def close(self) -> None:
        """Release connections; called when the relay stops."""


class LoggingTransport(Transport):
    """Logs each message at INFO on the ``outbox.transport`` logger (development)."""

    def send(self, messages: Sequence[Message]) -> None:
        for message in messages:
            logger.info(
                "outbox message %s tenant=%s topic=%s key=%s payload=%s",
                message.message_id, message.tenant_id, message.topic, message.key,
                message.payload,
            )


class CeleryTransport(Transport):
    """Sends each message, its envelope as the one argument and its id as ``task_id``, to
    the Celery task ``OUTBOX["CELERY_TASK"]`` names for its topic, on ``CELERY_QUEUE``
    or as Celery's ``task_routes`` route it (docs/outbox.md, "Transports").

    Celery builds each message around the envelope's JSON as PostgreSQL wrote it
    and publishes it (its publish signals fire) through a kombu ``Producer`` on
    the transport's own connection, a batch inside ``Producer.batch()`` (one
    pipeline on Redis). On RabbitMQ :meth:`send` returns only once every message
    is confirmed; else :class:`BatchNotConfirmed`. Nothing is retried inside
    Celery or kombu (``retry=False``): the relay backs off and sends the batch
    again, and an outage never blocks inside kombu while holding a batch.
    """

    reads_envelopes = True

    def __init__(self, app: Any = None) -> None:
        self._app = app
        self._publisher: _Publisher | None = None

    def close(self) -> None:
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None

    @property
    def app(self) -> Any:
        if self._app is None:
            from outbox.celery import celery_app

            self._app = celery_app()
        return self._app

    def task_for(self, topic: str) -> str:
        return task_for("CELERY_TASK", "Celery", topic)

    def send(self, messages: Sequence[Message | Envelope]) -> None:
        from outbox.celery import route

        app = self.app
        routes: dict[str, tuple[str, dict[str, Any]]] = {}  # config errors before any I/O
        for message in messages:
            if message.topic not in routes:
                task = self.task_for(message.topic)
                routes[message.topic] = (task, route(app, task))
        envelopes = [m if isinstance(m, Envelope) else Envelope.of(m) for m in messages]
        if self._publisher is None:
            self._publisher = _Publisher(app)
        try:
            self._publisher.send(app, envelopes, routes)
        except BaseException:
            # Confirms of this batch may still be on their way: a new connection
            # for the next one, whose numbering starts afresh.
            self._publisher.drop()
            self._publisher = None
            raise


class BatchNotConfirmed(Exception):
    """RabbitMQ did not confirm every message of a batch: the relay sends it again."""


class _Publisher:
    """The Celery transport's own connection, one channel and a kombu Producer on it.

    Not one of Celery's pool: on RabbitMQ its channel numbers its publishes
    from 1 for the confirms, which anyone else's publish would shift; and
    kombu's ``confirm_publish`` would wait for each confirm, where this awaits a
    batch's together. A broker that stops answering cannot hold :meth:`close`
    past the confirm timeout (the socket's read timeout); one that stops reading
    fails the batch at once (py-amqp's ``TCP_USER_TIMEOUT``).
    """

    def __init__(self, app: Any) -> None:
        options = app.conf.broker_transport_options or {}
        self.timeout = float(options.get("confirm_timeout", 30))
        # No heartbeats: nothing here would send them while the relay idles,
        # and a dead peer shows as a confirm that does not come in time.
        self.connection = app.connection_for_write(
            transport_options={"confirm_publish": False, "read_timeout": self.timeout},
            heartbeat=0)
        self.confirms: _Confirms | None = None
        try:
            self.connection.connect()
            channel = self.connection.channel()
            if hasattr(channel, "confirm_select"):  # RabbitMQ
                from outbox.celery import check_broker

                for problem in check_broker(app):
                    raise ConfigurationError(f"{problem.message} ({problem.id})")
                channel.confirm_select()
                self.confirms = _Confirms(channel)
            from kombu import Producer

            self.producer = Producer(
                channel, on_return=self.confirms.returned if self.confirms else None)
        except BaseException:
            self.drop()
            raise

    def send(self, app: Any, envelopes: Sequence[Envelope],
             routes: dict[str, tuple[str, dict[str, Any]]]) -> None:
        from celery.utils.nodenames import anon_nodename
        from kombu.utils.json import dumps

        producer = self.producer
        for _, options in routes.values():  # kombu declares each once per connection
            if options.get("queue") is not None:
                producer.maybe_declare(options["queue"], retry=False)
        origin = anon_nodename()  # what as_task_v2 would compute for each message
        trace = tracing.enabled()
        if self.confirms is not None:
            self.confirms.expect(len(envelopes))
        batch = getattr(producer, "batch", None)  # kombu < 5.7: a round trip per message
        with batch(max_size=max(len(envelopes), 1)) if batch else nullcontext():
            for envelope in envelopes:
                task, options = routes[envelope.topic]
                headers, properties, (_, kwargs, embed), sent_event = app.amqp.as_task_v2(
                    envelope.message_id, task, args=(), kwargs={}, origin=origin,
                    # Celery would otherwise build a printable copy of every payload.
                    argsrepr=f"[<outbox message {envelope.message_id} {envelope.topic}>]",
                    kwargsrepr="{}")
                # The body is Celery's (args, kwargs, embed) with the envelope as it
                # came from PostgreSQL: kombu sends a text body with its content type
                # as it is.
                body = f"[[{envelope.json}],{dumps(kwargs)},{dumps(embed)}]"
                app.amqp.send_task_message(
                    producer, task, (headers, properties, body, sent_event),
                    retry=False, declare=[], mandatory=True, content_type="application/json",
                    content_encoding="utf-8",
                    headers=tracing.context_headers(envelope.data().get("headers"))
                    if trace else None,
                    **options)
        if self.confirms is not None:
            self.confirms.wait(self.connection, self.timeout)

    def close(self) -> None:
        """Close the connection (the relay stops)."""
        try:
            self.connection.release()
        except Exception:  # already broken: nothing left to close
            pass

    def drop(self) -> None:
        """Let the connection go without a word to a broker that may not answer."""
        try:
            self.connection.collect()
        except Exception:
            pass


class _Confirms:
    """RabbitMQ's confirms on the publisher's channel, batch by batch.

    The channel numbers its publishes from 1. A batch of ``n`` expects the
    next ``n`` numbers; an ack covers one of them, or with ``multiple`` every
    one up to its number. RabbitMQ sends a ``basic.return`` (no queue took a
    ``mandatory`` message) before that message's ack.
    """

    def __init__(self, channel: Any) -> None:
        self.published = 0
        self.first = self.low = 1  # the batch's first number; the lowest unconfirmed
        self.waiting: set[int] = set()
        self.problem = ""
        channel.events["basic_ack"].add(self.ack)
        channel.events["basic_nack"].add(self.nack)

    def expect(self, count: int) -> None:
        self.first = self.low = self.published + 1
        self.published += count
        self.waiting = set(range(self.first, self.published + 1))
        self.problem = ""

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        if multiple:
            for number in range(self.low, delivery_tag + 1):
                self.waiting.discard(number)
            self.low = max(self.low, delivery_tag + 1)
        else:
            self.waiting.discard(delivery_tag)

    def nack(self, delivery_tag: int, multiple: bool) -> None:
        self.problem = self.problem or (
            f"RabbitMQ refused to store message {delivery_tag - self.first + 1} of the batch "
            "(basic.nack)")

    def returned(self, exc: Exception, exchange: Any, routing_key: str, message: Any) -> None:
        self.problem = self.problem or (
            f"RabbitMQ returned a message for {routing_key!r}: {exc} (no queue took it)")

    def wait(self, connection: Any, timeout: float) -> None:
        """Return once every message of the batch is confirmed; else raise BatchNotConfirmed."""
        deadline = time.monotonic() + timeout
        while self.waiting and not self.problem:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                connection.drain_events(timeout=remaining)
            except TimeoutError:
                break
        if self.problem:
            raise BatchNotConfirmed(self.problem)
        if self.waiting:
            count = self.published - self.first + 1
            raise BatchNotConfirmed(
                f"RabbitMQ confirmed {count - len(self.waiting)} of {count} message(s) "
                f"within {timeout:g} s")


def get_transport(transport: Transport | str | None = None) -> Transport:
    """The transport named by ``OUTBOX["TRANSPORT"]`` (a dotted class path or an instance)."""
    value = transport if transport is not None else outbox_settings.TRANSPORT
    if value is None:
        raise ConfigurationError(
            'OUTBOX["TRANSPORT"] is None: this project runs no relay (name a transport, or '
            "give relay_outbox --transport)"
        )
    if isinstance(value, Transport):
        return value
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise ConfigurationError(f'OUTBOX["TRANSPORT"]: cannot import {value!r}') from exc
    if isinstance(value, type) and issubclass(value, Transport):
        return value()
    raise ConfigurationError(f'OUTBOX["TRANSPORT"] = {value!r} is not an outbox Transport')
