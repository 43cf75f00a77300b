"""Where the relay sends messages: Celery (default), a log, or memory (tests).

A transport's ``send`` either delivers the whole batch or raises. The relay
advances its offset only after ``send`` returned, so a batch that failed
halfway is sent again whole: delivery to the broker is at-least-once, and
receivers de-duplicate by message id (:mod:`outbox.receivers`).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from django.utils.module_loading import import_string

from django_idempotency_outbox import tracing
from django_idempotency_outbox.errors import ConfigurationError
from outbox.conf import outbox_settings, task_for
from outbox.stream import Envelope, Message

logger = logging.getLogger("outbox.transport")


class Transport:
    """Base class. Subclasses implement :meth:`send`.

    A transport that sends JSON may also set :attr:`reads_envelopes` and
    implement :meth:`send_envelopes`: the relay then reads each message as
    its envelope's JSON text, built by PostgreSQL, and calls that instead.
    """

    @property
    def reads_envelopes(self) -> bool:
        """True: the relay calls :meth:`send_envelopes` instead of :meth:`send`."""
        return False

    def send(self, messages: Sequence[Message]) -> None:
        """Deliver every message of ``messages`` or raise."""
        raise NotImplementedError

    def send_envelopes(self, envelopes: Sequence[Envelope]) -> None:
        """Deliver every message of ``envelopes`` or raise (default: :meth:`send`)."""
        self.send([envelope.message() for envelope in envelopes])

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
    """Sends each message to a Celery task, chosen by topic.

    The task receives one argument, the message envelope
    (:meth:`outbox.stream.Message.envelope`, a JSON-serialisable dict) and is
    sent with ``task_id`` = the message id. The task is
    the one ``OUTBOX["CELERY_TASK"]`` names for its topic;
    its queue is ``OUTBOX["CELERY_QUEUE"]``, else Celery's own routing
    (``task_routes``). A batch is written to the broker in one round trip
    where kombu supports it (Redis, kombu >= 5.7).

    By default the Celery message is built with ``app.amqp.as_task_v2`` and
    published with kombu directly, skipping ``send_task``'s per-message
    routing, printable argument copies and publish signals (together more
    than half the relay's time). Set ``OUTBOX["CELERY_SEND_TASK"] = True`` to
    go through ``app.send_task`` (e.g. for ``before_task_publish`` handlers,
    or routes to non-direct exchanges, which always take that path).

    On kombu's Redis transport the batch is written with one LPUSH per Redis
    list, each message built by Celery's and kombu's own steps, with the
    envelope's JSON as PostgreSQL wrote it (:class:`_RedisWire`, where the
    conditions are listed; docs/outbox.md).

    On RabbitMQ (kombu's ``pyamqp`` transport) the batch is published on a
    channel in confirm mode and :meth:`send` returns only once RabbitMQ has
    confirmed every message of it (:class:`_AmqpWire`): a message nacked,
    returned as unroutable, or not confirmed within the confirm timeout
    raises, and the relay keeps its offset and sends the batch again. It
    refuses to publish (``ConfigurationError``) to a RabbitMQ without
    ``broker_transport_options = {"confirm_publish": True}`` or to a queue
    that a restart would lose (``outbox.E110``/``E111`` say so at ``check``).

    Publishing is never retried inside Celery or kombu (``retry=False``): the
    relay does its own backoff and sends the batch again, so an outage never
    blocks inside kombu while holding a batch.
    """

    @property
    def reads_envelopes(self) -> bool:
        """True unless a subclass overrides :meth:`send` only: it then sees every batch."""
        kind = type(self)
        return (kind.send is CeleryTransport.send
                or kind.send_envelopes is not CeleryTransport.send_envelopes)

    def __init__(self, app: Any = None) -> None:
        self._app = app
        self._amqp: _AmqpWire | None = None
        self._amqp_applies: bool | None = None

    def close(self) -> None:
        if self._amqp is not None:
            self._amqp.close()
            self._amqp = None

    @property
    def app(self) -> Any:
        if self._app is None:
            name = outbox_settings.CELERY_APP
            if name:
                self._app = import_string(name) if isinstance(name, str) else name
            else:
                from celery import current_app

                self._app = current_app
        return self._app

    def task_for(self, topic: str) -> str:
        task = task_for(outbox_settings.CELERY_TASK, topic)
        if not task:
            raise ConfigurationError(
                f'no Celery task for topic {topic!r}: set OUTBOX["CELERY_TASK"] (a task, or a '
                'dict topic -> task with "*" for every other topic)'
            )
        return str(task)

    def _queue_for(self, task: str) -> Any:
        """The kombu Queue for ``task``, or None when it is not a direct-exchange queue."""
        app = self.app
        name = outbox_settings.CELERY_QUEUE
        if name:
            queue = app.amqp.queues[name]
        else:
            queue = app.amqp.router.route({}, task, (), {}).get("queue")
            if isinstance(queue, str):
                queue = app.amqp.queues[queue]
        if queue is None or getattr(queue.exchange, "type", "direct") != "direct":
            return None
        return queue

    def send(self, messages: Sequence[Message]) -> None:
        self._send([_Outgoing(str(m.message_id), m.topic, data=m.envelope()) for m in messages])

    def send_envelopes(self, envelopes: Sequence[Envelope]) -> None:
        self._send([_Outgoing(e.message_id, e.topic, text=e.json) for e in envelopes])

    def _send(self, items: Sequence[_Outgoing]) -> None:
        routes: dict[str, str] = {}  # topic -> task; config errors before any I/O
        for item in items:
            if item.topic not in routes:
                routes[item.topic] = self.task_for(item.topic)
        tasks = [routes[item.topic] for item in items]
        app = self.app
        queues: dict[str, Any] = {}
        if not outbox_settings.CELERY_SEND_TASK:
            queues = {task: self._queue_for(task) for task in set(tasks)}
        declared: set[str] = set()
        if self._amqp_applies is None:
            self._amqp_applies = _AmqpWire.applies(app)
        if queues and None not in queues.values() and self._amqp_applies:
            if self._amqp is None:
                self._amqp = _AmqpWire(app)
            try:
                self._amqp.send(app, items, tasks, queues)
            except BaseException:
                # Confirms of this batch may still be on their way: a new
                # connection for the next one, whose numbering starts afresh.
                self._amqp.close()
                self._amqp = None
                raise
            return
        with app.producer_or_acquire() as producer:
            _refuse_unconfirmed(producer)
            if queues and None not in queues.values():
                wire = _RedisWire.for_producer(producer)
                if wire is not None and wire.send(app, items, tasks, queues):
                    return
            batch = getattr(producer, "batch", None)
            if batch is None:  # kombu < 5.7: one round trip per message
                for item, task in zip(items, tasks, strict=True):
                    self._send_one(app, producer, item, task, queues.get(task), declared)
                return
            with batch(max_size=max(len(items), 1)):
                for item, task in zip(items, tasks, strict=True):
                    self._send_one(app, producer, item, task, queues.get(task), declared)

    @staticmethod
    def _send_one(
        app: Any, producer: Any, item: _Outgoing, task: str, queue: Any, declared: set[str]
    ) -> None:
        # Declaring a queue once per batch is enough (per message it costs a
        # third of a send).
        declare = [] if queue is None or queue.name in declared else [queue]
        if queue is None:
            options: dict[str, Any] = {
                "retry": False, "argsrepr": item.argsrepr(), "kwargsrepr": "{}",
            }
            if outbox_settings.CELERY_QUEUE:
                options["queue"] = outbox_settings.CELERY_QUEUE
            trace = item.trace_headers()
            if trace:
                options["headers"] = trace
            app.send_task(task, args=[item.as_dict()], task_id=item.message_id,
                          producer=producer, **options)
            return
        headers, properties, body, _ = app.amqp.as_task_v2(
            item.message_id, task, args=[item.as_dict()], kwargs={},
            argsrepr=item.argsrepr(), kwargsrepr="{}",
        )
        headers.update(item.trace_headers())
        producer.publish(
            body, exchange="", routing_key=queue.name, serializer="json", headers=headers,
            delivery_mode=queue.exchange.delivery_mode or 2, declare=declare, retry=False,
            **properties,
        )
        declared.add(queue.name)


class _Outgoing:
    """One message on its way to Celery: its envelope as a dict, as JSON text, or both."""

    __slots__ = ("_data", "_text", "message_id", "topic")

    def __init__(
        self, message_id: str, topic: str, *, data: dict[str, Any] | None = None,
        text: str | None = None,
    ) -> None:
        self.message_id = message_id
        self.topic = topic
        self._data = data
        self._text = text

    def argsrepr(self) -> str:
        # Celery would otherwise build a printable copy of every payload.
        return f"[<outbox message {self.message_id} {self.topic}>]"

    def trace_headers(self) -> dict[str, str]:
        """The message's trace context, for the Celery task's headers (when tracing is on)."""
        if not tracing.enabled():
            return {}
        return tracing.context_headers(self.as_dict().get("headers"))

    def as_dict(self) -> dict[str, Any]:
        if self._data is None:
            self._data = json.loads(self._text)  # type: ignore[arg-type]
        return self._data

    def as_json(self, dumps: Callable[[Any], str]) -> str:
        if self._text is None:
            self._text = dumps(self._data)
        return self._text


class _RedisWire:
    """The Celery transport's fast path when the broker is kombu's Redis transport.

    kombu's ``Producer.publish`` cost most of the relay's time per message: its
    argument handling, then one buffered LPUSH command and one reply per
    message. Here each message goes through the steps of kombu's own code
    that ``publish`` runs for a direct queue of the default exchange --
    Celery's ``as_task_v2`` (headers and properties), the JSON body,
    ``channel.prepare_message``, ``channel._inplace_augment_message`` (body
    encoding, delivery tag, delivery info) and the channel's priority-to-key
    mapping -- and the batch is then written with one ``LPUSH key message...``
    per Redis list: one round trip, one reply, and atomic (all of the list's
    messages or none). LPUSH of several values pushes them in argument order,
    so workers (BRPOP) take them first-in, first-out, as before.

    The body is the JSON of Celery's ``(args, kwargs, embed)`` with the
    envelope's JSON text put in as it came from PostgreSQL
    (:class:`~outbox.stream.Envelope`), so a payload is never parsed and
    serialised again.

    Used only when every condition below holds, else the standard path runs
    (:meth:`for_producer` returns None, or :meth:`send` returns False before
    any I/O):

    * the channel is kombu's Redis channel (or a subclass, e.g. Sentinel's)
      whose ``basic_publish``, ``_inplace_augment_message``, ``prepare_message``
      and ``_put`` are kombu's own: nothing overrides how a message is written;
    * the producer has no exchange of its own and no compression;
    * kombu itself would pipeline publishes on this channel
      (``supports_batch_publish``: no client-side retry configured);
    * every queue is a direct-exchange queue (``_queue_for``) without
      ``x-expires`` (kombu would add PEXPIRE commands).

    ``global_keyprefix`` is applied by the channel's own client (the list's
    key is the first argument of LPUSH, the one kombu's client prefixes).

    The kombu and Celery members used here are not public API:
    tests/outbox/test_redis_wire.py holds what this writes to the bytes kombu's
    ``Producer.publish`` writes, and tests/outbox/test_upstream.py the members
    it calls, so a release that changes them fails the suite.
    """

    __slots__ = ("channel", "producer")

    def __init__(self, producer: Any, channel: Any) -> None:
        self.producer = producer
        self.channel = channel

    @classmethod
    def for_producer(cls, producer: Any) -> _RedisWire | None:
        try:
            from kombu.transport import redis as kombu_redis
            from kombu.transport.virtual import base as kombu_virtual
        except ImportError:  # redis-py missing: not a Redis broker anyway
            return None
        channel = producer.channel
        kind = type(channel)
        if not (
            isinstance(channel, kombu_redis.Channel)
            and kind._put is kombu_redis.Channel._put
            and kind.basic_publish is kombu_virtual.Channel.basic_publish
            and kind._inplace_augment_message is kombu_virtual.Channel._inplace_augment_message
            and kind.prepare_message is kombu_virtual.Channel.prepare_message
            and not getattr(producer.exchange, "name", "")
            and not producer.compression
            # kombu's own test for pipelining publishes: no client-side retry
            # that could replay a write whose reply was lost
            and getattr(channel, "supports_batch_publish", False)
        ):
            return None
        return cls(producer, channel)

    def send(
        self, app: Any, items: Sequence[_Outgoing], tasks: Sequence[str], queues: dict[str, Any]
    ) -> bool:
        from celery.utils.nodenames import anon_nodename
        from kombu.entity import maybe_delivery_mode
        from kombu.serialization import dumps as serialize
        from kombu.utils.json import dumps as json_dumps

        channel, producer = self.channel, self.producer
        for queue in queues.values():
            producer.maybe_declare(queue, retry=False)
            if channel._expires and queue.name in channel._expires:
                return False
        content_type, content_encoding, _ = serialize([], serializer="json")
        modes = {t: maybe_delivery_mode(q.exchange.delivery_mode or 2) for t, q in queues.items()}
        as_task = app.amqp.as_task_v2
        origin = anon_nodename()  # what as_task_v2 would compute for each message
        prepare, augment = channel.prepare_message, channel._inplace_augment_message
        priority_of, key_for = channel._get_message_priority, channel._q_for_pri
        def whole(item: _Outgoing, task: str) -> tuple[str, str]:
            """The Redis list and the message of ``item``, each step run for it alone."""
            name = queues[task].name
            headers, properties, (args, kwargs, embed), _ = as_task(
                item.message_id, task, args=(), kwargs={}, origin=origin,
                argsrepr=item.argsrepr(), kwargsrepr="{}",
            )
            if trace:
                headers.update(item.trace_headers())
            body = f"[[{item.as_json(json_dumps)}],{json_dumps(kwargs)},{json_dumps(embed)}]"
            properties["delivery_mode"] = modes[task]
            wire = prepare(body, 0, content_type, content_encoding, headers, properties)
            augment(wire, "", name)
            return key_for(name, priority_of(wire, reverse=False)), json_dumps(wire)

        lists: dict[str, list[str]] = {}
        trace = tracing.enabled()
        templates: dict[str, _Template | None] = {}
        for item, task in zip(items, tasks, strict=True):
            if task not in templates:
                # Each message carries its own trace context in its headers.
                templates[task] = None if trace else _Template.of(
                    whole(_Template.HOLES, task), json_dumps)
            template = templates[task]
            key, text = whole(item, task) if template is None else template.fill(item)
            lists.setdefault(key, []).append(text)
        with channel.conn_or_acquire() as client:
            if len(lists) == 1:
                [(key, values)] = lists.items()
                client.lpush(key, *values)
            else:
                with client.pipeline(transaction=False) as pipe:
                    for key, values in lists.items():
                        pipe.lpush(key, *values)
                    pipe.execute()
        return True


def _refuse_unconfirmed(producer: Any) -> None:
    """Raise before publishing to RabbitMQ on a connection without publisher confirms."""
    try:
        from kombu.transport import pyamqp
    except ImportError:  # py-amqp missing: not RabbitMQ
        return
    channel = producer.channel
    if isinstance(channel, pyamqp.Channel) and not channel.connection.confirm_publish:
        raise ConfigurationError(_NO_CONFIRMS)


_NO_CONFIRMS = (
    "the Celery broker is RabbitMQ without publisher confirms: the outbox will not publish "
    "to it, since it could not know which messages RabbitMQ stored (set "
    'broker_transport_options = {"confirm_publish": True}; outbox.E110)'
)


class _AmqpWire:
    """The Celery transport on RabbitMQ: a whole batch published, then its confirms awaited.

    kombu's ``confirm_publish`` makes each ``basic.publish`` wait for the
    broker's ``basic.ack``: one round trip per message. Here the batch is
    published at once, each message built by Celery's ``as_task_v2`` and
    kombu's channel (``prepare_message``), with ``mandatory`` set, on a
    channel of this transport's own connection in confirm mode; then the
    acknowledgements are read until every message of the batch is confirmed.
    RabbitMQ numbers a confirm channel's publishes from 1, so the batch is
    confirmed when an ack covers the number of its last message (an ack may
    cover several: ``multiple``). A ``basic.nack`` (RabbitMQ could not store
    it), a ``basic.return`` (no queue took it) or no confirm within
    ``broker_transport_options["confirm_timeout"]`` (30 s unless set) raises
    :class:`BatchNotConfirmed`; the caller then drops the connection (late
    confirms of this batch must not be counted for the next one).

    RabbitMQ confirms a persistent message routed to a durable queue once it
    is written to disk, so a confirmed batch survives a restart of the
    broker. The queues are checked first (:func:`outbox.celery.transient_reason`)
    and declared once per connection.

    The channel is the transport's own, never one of Celery's producer pool:
    a publish by someone else on a shared channel would shift the numbering.
    """

    __slots__ = ("_channel", "_connection", "_declared", "_published")

    def __init__(self, app: Any) -> None:
        # No heartbeats: nothing here would send them while the relay idles,
        # and a dead peer shows as a confirm that does not come in time.
        self._connection = app.connection_for_write(heartbeat=0)
        self._channel: Any = None
        self._published = 0  # publishes on this channel since confirm.select
        self._declared: set[str] = set()

    @staticmethod
    def applies(app: Any) -> bool:
        """Whether the app's broker is RabbitMQ through kombu's pyamqp transport."""
        try:
            from kombu.transport import pyamqp
        except ImportError:
            return False
        from outbox.celery import is_amqp

        if not is_amqp(app):
            return False
        with app.connection_for_write() as connection:  # not connected: no I/O
            return isinstance(connection.transport, pyamqp.Transport)

    def close(self) -> None:
        try:
            self._connection.release()
        except Exception:  # already broken: nothing left to close
            pass

    def _confirming_channel(self) -> Any:
        if self._channel is None:
            connection = self._connection
            connection.connect()
            if not connection.connection.confirm_publish:
                raise ConfigurationError(_NO_CONFIRMS)
            channel = connection.channel()
            channel.confirm_select()
            self._channel, self._published, self._declared = channel, 0, set()
        return self._channel

    def send(
        self, app: Any, items: Sequence[_Outgoing], tasks: Sequence[str], queues: dict[str, Any]
    ) -> None:
        from celery.utils.nodenames import anon_nodename
        from kombu.entity import maybe_delivery_mode
        from kombu.serialization import dumps as serialize
        from kombu.utils.json import dumps as json_dumps

        from outbox.celery import transient_reason

        for queue in queues.values():
            reason = transient_reason(queue)
            if reason is not None:
                raise ConfigurationError(
                    f"the queue {queue.name!r} {reason}: RabbitMQ would lose its messages on a "
                    "restart, after the relay moved past them (outbox.E111)")
        channel = self._confirming_channel()
        for queue in queues.values():
            if queue.name not in self._declared:
                queue(channel).declare()
                self._declared.add(queue.name)
        content_type, content_encoding, _ = serialize([], serializer="json")
        modes = {t: maybe_delivery_mode(q.exchange.delivery_mode or 2) for t, q in queues.items()}
        as_task = app.amqp.as_task_v2
        origin = anon_nodename()
        trace = tracing.enabled()
        outcome = _Confirms(self._published, len(items))
        channel.events["basic_ack"].add(outcome.ack)
        channel.events["basic_nack"].add(outcome.nack)
        channel.events["basic_return"].add(outcome.returned)
        try:
            tail: tuple[Any, str] = (None, "")
            for item, task in zip(items, tasks, strict=True):
                headers, properties, (_, kwargs, embed), _ = as_task(
                    item.message_id, task, args=(), kwargs={}, origin=origin,
                    argsrepr=item.argsrepr(), kwargsrepr="{}",
                )
                if trace:
                    headers.update(item.trace_headers())
                if tail[0] != (kwargs, embed):
                    tail = ((kwargs, embed), f"{json_dumps(kwargs)},{json_dumps(embed)}]")
                body = f"[[{item.as_json(json_dumps)}],{tail[1]}"
                properties["delivery_mode"] = modes[task]
                message = channel.prepare_message(
                    body, properties.pop("priority", 0), content_type, content_encoding,
                    headers, properties,
                )
                channel._basic_publish(message, exchange="", routing_key=queues[task].name,
                                       mandatory=True)
                self._published += 1
            options = app.conf.broker_transport_options or {}
            outcome.wait(self._connection.connection, float(options.get("confirm_timeout", 30)))
        finally:
            channel.events["basic_ack"].discard(outcome.ack)
            channel.events["basic_nack"].discard(outcome.nack)
            channel.events["basic_return"].discard(outcome.returned)


class BatchNotConfirmed(Exception):
    """RabbitMQ did not confirm every message of a batch: the relay sends it again."""


class _Confirms:
    """The confirms of one batch: publishes ``first + 1`` to ``first + count`` of a channel."""

    __slots__ = ("acked", "count", "first", "last", "problem")

    def __init__(self, first: int, count: int) -> None:
        self.first = self.acked = first
        self.count = count
        self.last = first + count
        self.problem = ""

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        # Acks come in order of the publishes; a multiple one covers all before it.
        self.acked = max(self.acked, delivery_tag)

    def nack(self, delivery_tag: int, multiple: bool) -> None:
        self.problem = self.problem or f"RabbitMQ refused to store message {delivery_tag} (nack)"

    def returned(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        self.problem = self.problem or (
            f"RabbitMQ returned a message for {routing_key!r}: {exc} (no queue took it)")

    def wait(self, connection: Any, timeout: float) -> None:
        import time

        deadline = time.monotonic() + timeout
        while self.acked < self.last and not self.problem:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                connection.drain_events(timeout=remaining)
            except TimeoutError:
                break
        if self.problem:
            raise BatchNotConfirmed(self.problem)
        if self.acked < self.last:
            raise BatchNotConfirmed(
                f"RabbitMQ confirmed {self.acked - self.first} of {self.count} message(s) "
                f"within {timeout:g} s")


class _Template:
    """A task's Redis message as :class:`_RedisWire` writes it, with holes for what varies.

    Building each message through Celery's and kombu's steps cost most of the
    relay's time per message (docs/benchmarks.md). Those steps put what
    varies from one message to the next into the message verbatim: the task
    id (the outbox message id) in the headers' ``id`` and ``root_id`` and the
    properties' ``correlation_id``, the printable arguments in ``argsrepr``,
    the body (base64 of the JSON of ``[[envelope], kwargs, embed]``) and
    kombu's random delivery tag; nothing else in the message depends on them.
    So the steps run once per task and batch, for a stand-in message whose
    id, argsrepr, body and tag are placeholders (:data:`HOLES`), and each
    message is that message's JSON with its own values in those places.

    The template is used only if each placeholder is found exactly where
    those steps put it (three ids, one of each other), else each message is
    built whole: a release of Celery or kombu that puts them elsewhere, or
    copies them, changes nothing but the speed. tests/outbox/test_redis_wire.py
    holds the messages to the bytes kombu's own ``Producer.publish`` writes.
    """

    ID = "dio-hole-1d"
    ARGSREPR = "dio-hole-argsrepr"
    BODY = "dio-hole-b0dy"
    TAG = "dio-hole-tag"
    #: Where each placeholder must be, and how often.
    EXPECTED = {ID: 3, ARGSREPR: 1, BODY: 1, TAG: 1}

    class _StandIn:
        """What :meth:`_RedisWire.send`'s steps read of a message, as placeholders."""

        message_id = "dio-hole-1d"

        @staticmethod
        def argsrepr() -> str:
            return _Template.ARGSREPR

        @staticmethod
        def as_json(dumps: Any) -> str:
            return _Template.BODY

    HOLES: Any = _StandIn()

    __slots__ = ("dumps", "holes", "key", "literals", "tail")

    def __init__(self, key: str, literals: list[str], holes: list[str], tail: str,
                 dumps: Callable[[Any], str]) -> None:
        self.key = key
        self.literals = literals
        self.holes = holes
        self.tail = tail
        self.dumps = dumps

    @classmethod
    def of(cls, built: tuple[str, str], dumps: Callable[[Any], str]) -> _Template | None:
        """The template of a stand-in message built whole; None if its holes are not as expected."""
        key, text = built
        message = json.loads(text)
        body = base64.b64decode(message["body"]).decode()
        prefix = f"[[{cls.BODY}],"
        if not body.startswith(prefix):
            return None
        # The message as built, with the placeholders kombu could not see through:
        # the body was base64-encoded and the tag is random.
        text = text.replace(json.dumps(message["body"]), json.dumps(cls.BODY), 1)
        text = text.replace(json.dumps(message["properties"]["delivery_tag"]),
                            json.dumps(cls.TAG), 1)
        if {hole: text.count(hole) for hole in cls.EXPECTED} != cls.EXPECTED:
            return None
        pieces = re.split(f"({'|'.join(map(re.escape, cls.EXPECTED))})", text)
        return cls(key, pieces[0::2], pieces[1::2], body[len(prefix):], dumps)

    def fill(self, item: _Outgoing) -> tuple[str, str]:
        """The Redis list and the message of ``item``."""
        body = f"[[{item.as_json(self.dumps)}],{self.tail}"
        values = {
            self.ID: item.message_id,
            self.ARGSREPR: json.dumps(item.argsrepr())[1:-1],
            self.BODY: base64.b64encode(body.encode()).decode(),
            self.TAG: str(uuid.uuid4()),  # kombu's delivery tag: a new uuid4 per message
        }
        out = [self.literals[0]]
        for hole, literal in zip(self.holes, self.literals[1:], strict=True):
            out.append(values[hole])
            out.append(literal)
        return self.key, "".join(out)


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
