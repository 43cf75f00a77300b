"""A transport for the SIGTERM test of tests/outbox/test_claims_processes.py."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from outbox.stream import Message
from outbox.transports import CeleryTransport


class MarkedSlowSend(CeleryTransport):
    """Touches $DIO_SEND_MARKER when a batch is in flight, waits $DIO_SEND_DELAY
    seconds, then publishes the batch to the real broker."""

    def send(self, messages: Sequence[Message]) -> None:
        Path(os.environ["DIO_SEND_MARKER"]).touch()
        time.sleep(float(os.environ.get("DIO_SEND_DELAY", "0")))
        super().send(messages)
