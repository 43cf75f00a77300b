"""Transports for crash tests."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from outbox.stream import Message
from outbox.transports import CeleryTransport, Transport


class DieAfterSend(CeleryTransport):
    """Publishes the batch to the real broker, then the process dies (SIGKILL)
    before the relay can advance its offset."""

    def send(self, messages: Sequence[Message]) -> None:
        super().send(messages)
        os.kill(os.getpid(), signal.SIGKILL)


class SlowSend(CeleryTransport):
    """Publishes each batch to the real broker after $DIO_SEND_DELAY seconds: a
    broker call that takes far longer than the relay's lease. With
    $DIO_SEND_MARKER set, touches that file first (the batch is in flight)."""

    def send(self, messages: Sequence[Message]) -> None:
        if os.environ.get("DIO_SEND_MARKER"):
            Path(os.environ["DIO_SEND_MARKER"]).touch()
        time.sleep(float(os.environ.get("DIO_SEND_DELAY", "0")))
        super().send(messages)


class DieAfterTasksSend(Transport):
    """The Django tasks transport's send (its batch committed), then SIGKILL before the
    relay can advance its offset."""

    def send(self, messages: Sequence[Message]) -> None:
        from outbox.django_tasks import DjangoTasksTransport

        DjangoTasksTransport().send(messages)
        os.kill(os.getpid(), signal.SIGKILL)


def _dies_mid_tasks_batch() -> type:
    from outbox.django_tasks import DjangoTasksTransport

    class DieMidTasksBatch(DjangoTasksTransport):
        """Enqueues two messages of the batch, then the process dies (SIGKILL) while
        enqueueing the third: on django-tasks-db, nothing of the batch is left."""

        def task_for(self, topic: str) -> object:
            return _DyingTask(super().task_for(topic))

    return DieMidTasksBatch


class _DyingTask:
    enqueued = 0

    def __init__(self, task: object) -> None:
        self.task = task

    def get_backend(self) -> object:
        return self.task.get_backend()  # type: ignore[attr-defined]

    def enqueue(self, *args: object, **kwargs: object) -> object:
        if _DyingTask.enqueued == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        _DyingTask.enqueued += 1
        return self.task.enqueue(*args, **kwargs)  # type: ignore[attr-defined]


def __getattr__(name: str) -> type:
    if name == "DieMidTasksBatch":  # built on first use: the Django tasks modules load late
        return _dies_mid_tasks_batch()
    raise AttributeError(name)
