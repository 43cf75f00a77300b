"""The benchmark's no-op consumer and its Celery app (only sent to, never run)."""

from __future__ import annotations

import os

from celery import Celery

from outbox import Consumer, Message

celery = Celery("dio_bench", broker=os.environ.get("DIO_REDIS_URL", "redis://127.0.0.1:6379/0"))


class Noop(Consumer):
    name = "bench-noop"
    batch_size = 1000

    def handle(self, message: Message) -> None:
        pass
