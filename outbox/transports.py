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
    where kombu supports it (Redis).

    Publishing is not retried by Celery (``retry=False``): the relay does its
    own backoff and sends the batch again, so an outage never blocks inside
    kombu while holding a batch.
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

    def send(self, messages: Sequence[Message]) -> None:
        tasks = [self.task_for(m.topic) for m in messages]  # config errors before any I/O
        queue = outbox_settings.CELERY_QUEUE
        options: dict[str, Any] = {"retry": False}
        if queue:
            options["queue"] = queue
        app = self.app
        with app.producer_or_acquire() as producer:
            batch = getattr(producer, "batch", None)
            if batch is None:  # kombu < 5.7: one round trip per message
                for message, task in zip(messages, tasks, strict=True):
                    self._send_one(app, producer, message, task, options)
                return
            with batch(max_size=max(len(messages), 1)):
                for message, task in zip(messages, tasks, strict=True):
                    self._send_one(app, producer, message, task, options)

    @staticmethod
    def _send_one(app: Any, producer: Any, message: Message, task: str, options: Any) -> None:
        app.send_task(
            task,
            args=[message.envelope()],
            task_id=str(message.message_id),
            producer=producer,
            **options,
        )


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
