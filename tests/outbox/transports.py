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
