"""What ``make bench-scale`` adds to the test app: many tenants, many consumers.

- :class:`TenantUsers`: ``X-User: t<N>`` is a user of tenant N (user id N), so
  that wrk can spread requests over any number of tenants; the test app's own
  users (alice, bob...) keep working.
- :data:`TAILS`, :class:`Behind`: the consumers of the consumer curve. Each
  notes, for every message it handles, the time since the publisher stamped
  the message (``payload["t"]``, the wall clock just before COMMIT), and a
  thread of its process pushes the notes to Redis every half second
  (:func:`latencies`): a Redis round trip per message inside the batch's
  transaction would measure Redis, not the consumer.
- ``celery``: the Celery app the relay sends to (only sent to, never run).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, ClassVar

import redis
from celery import Celery
from rest_framework.authentication import BaseAuthentication

from outbox import Consumer, Message
from tests.testapp.auth import USERS, HeaderAuthentication, User

REDIS_URL = os.environ.get("DIO_REDIS_URL", "redis://127.0.0.1:6379/0")
celery = Celery("dio_bench_scale", broker=REDIS_URL)

#: Redis list of a consumer's latencies (seconds, as text).
LATENCY_LIST = "dio-bench-scale:latency:{}"


class TenantUsers(BaseAuthentication):
    """``X-User: t<N>``: user N of tenant N; any other name as the test app knows it."""

    def authenticate(self, request: Any) -> tuple[User, None] | None:
        name = request.META.get("HTTP_X_USER")
        if name and name[0] == "t" and name[1:].isdigit():
            number = int(name[1:])
            return User(number, name, number), None
        if name in USERS:
            return HeaderAuthentication().authenticate(request)
        return None

    def authenticate_header(self, request: Any) -> str:
        return "X-User"


class _Notes:
    """Latencies noted in this process, pushed to Redis by a thread of its own."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[str, list[str]] = {}
        self.thread: threading.Thread | None = None

    def note(self, consumer: str, seconds: float) -> None:
        with self.lock:
            self.pending.setdefault(consumer, []).append(f"{seconds:.6f}")
            if self.thread is None:
                self.thread = threading.Thread(target=self._push, daemon=True)
                self.thread.start()

    def _push(self) -> None:
        client = redis.Redis.from_url(REDIS_URL)
        while True:
            time.sleep(0.5)
            with self.lock:
                pending, self.pending = self.pending, {}
            for consumer, values in pending.items():
                client.rpush(LATENCY_LIST.format(consumer), *values)


_NOTES = _Notes()


class Tail(Consumer):
    """A no-op consumer that notes each message's latency (see the module)."""

    batch_size = 500

    def handle(self, message: Message) -> None:
        stamp = message.payload.get("t") if isinstance(message.payload, dict) else None
        if stamp is not None:
            _NOTES.note(self.name, time.time() - float(stamp))


def _tail(number: int) -> type[Tail]:
    return type(f"Tail{number}", (Tail,), {"name": f"tail-{number}", "__module__": __name__})


#: The ten consumers of one stream.
TAILS = [_tail(n) for n in range(10)]
for _cls in TAILS:
    globals()[_cls.__name__] = _cls


class Behind(Tail):
    """The consumer that starts far behind the others (paced by ``DIO_SCALE_BEHIND_RATE``,
    messages a second, when set)."""

    name: ClassVar[str] = "behind"
    max_rate = float(os.environ.get("DIO_SCALE_BEHIND_RATE") or 0) or None


def latencies(client: redis.Redis, consumer: str) -> list[float]:
    """The latencies ``consumer``'s processes have pushed so far (and forget them)."""
    key = LATENCY_LIST.format(consumer)
    with client.pipeline(transaction=True) as pipe:
        pipe.lrange(key, 0, -1)
        pipe.delete(key)
        values, _ = pipe.execute()
    return [float(v) for v in values]
