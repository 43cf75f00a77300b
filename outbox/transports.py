"""Where the relay sends messages: Celery (default), a log, or memory (tests).

A transport's ``send`` either delivers the whole batch or raises. The relay
advances its offset only after ``send`` returned, so a batch that failed
halfway is sent again whole: delivery to the broker is at-least-once, and
receivers de-duplicate by message id (:mod:`outbox.receivers`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from outbox.conf import outbox_settings
from outbox.stream import Message

logger = logging.getLogger("outbox.transport")


class Transport:
    """Base class. Subclasses implement :meth:`send`."""

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
    """Sends each message to a Celery task, chosen by topic.

    The task receives one argument, the message envelope
    (:meth:`outbox.stream.Message.envelope`, a JSON-serialisable dict) and is
    sent with ``task_id`` = the message id. The task is
    ``OUTBOX["CELERY_TOPIC_TASKS"][topic]``, else ``OUTBOX["CELERY_TASK"]``;
    its queue is ``OUTBOX["CELERY_QUEUE"]``, else Celery's own routing
    (``task_routes``). A batch is written to the broker in one round trip
    where kombu supports it (Redis, kombu >= 5.7).

    By default the Celery message is built with ``app.amqp.as_task_v2`` and
    published with kombu directly, skipping ``send_task``'s per-message
    routing, printable argument copies and publish signals (together more
    than half the relay's time). Set ``OUTBOX["CELERY_SEND_TASK"] = True`` to
    go through ``app.send_task`` (e.g. for ``before_task_publish`` handlers,
    or routes to non-direct exchanges, which always take that path).

    Publishing is never retried inside Celery or kombu (``retry=False``): the
    relay does its own backoff and sends the batch again, so an outage never
    blocks inside kombu while holding a batch.
    """

    def __init__(self, app: Any = None) -> None:
        self._app = app

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
        task = outbox_settings.CELERY_TOPIC_TASKS.get(topic) or outbox_settings.CELERY_TASK
        if not task:
            raise ImproperlyConfigured(
                f'no Celery task for topic {topic!r}: set OUTBOX["CELERY_TASK"] or '
                'OUTBOX["CELERY_TOPIC_TASKS"]'
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
        tasks = [self.task_for(m.topic) for m in messages]  # config errors before any I/O
        app = self.app
        queues: dict[str, Any] = {}
        if not outbox_settings.CELERY_SEND_TASK:
            queues = {task: self._queue_for(task) for task in set(tasks)}
        declared: set[str] = set()
        with app.producer_or_acquire() as producer:
            batch = getattr(producer, "batch", None)
            if batch is None:  # kombu < 5.7: one round trip per message
                for message, task in zip(messages, tasks, strict=True):
                    self._send_one(app, producer, message, task, queues.get(task), declared)
                return
            with batch(max_size=max(len(messages), 1)):
                for message, task in zip(messages, tasks, strict=True):
                    self._send_one(app, producer, message, task, queues.get(task), declared)

    @staticmethod
    def _send_one(
        app: Any, producer: Any, message: Message, task: str, queue: Any, declared: set[str]
    ) -> None:
        # Celery would otherwise build a printable copy of every payload.
        argsrepr = f"[<outbox message {message.message_id} {message.topic}>]"
        # Declaring a queue once per batch is enough (per message it costs a
        # third of a send).
        declare = [] if queue is None or queue.name in declared else [queue]
        if queue is None:
            options: dict[str, Any] = {"retry": False, "argsrepr": argsrepr, "kwargsrepr": "{}"}
            if outbox_settings.CELERY_QUEUE:
                options["queue"] = outbox_settings.CELERY_QUEUE
            app.send_task(task, args=[message.envelope()], task_id=str(message.message_id),
                          producer=producer, **options)
            return
        headers, properties, body, _ = app.amqp.as_task_v2(
            str(message.message_id), task, args=[message.envelope()], kwargs={},
            argsrepr=argsrepr, kwargsrepr="{}",
        )
        producer.publish(
            body, exchange="", routing_key=queue.name, serializer="json", headers=headers,
            delivery_mode=queue.exchange.delivery_mode or 2, declare=declare, retry=False,
            **properties,
        )
        declared.add(queue.name)


def get_transport(transport: Transport | str | None = None) -> Transport:
    """The transport named by ``OUTBOX["TRANSPORT"]`` (a dotted class path or an instance)."""
    value = transport if transport is not None else outbox_settings.TRANSPORT
    if isinstance(value, Transport):
        return value
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise ImproperlyConfigured(f'OUTBOX["TRANSPORT"]: cannot import {value!r}') from exc
    if isinstance(value, type) and issubclass(value, Transport):
        return value()
    raise ImproperlyConfigured(f'OUTBOX["TRANSPORT"] = {value!r} is not an outbox Transport')
