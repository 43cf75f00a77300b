"""Helpers for users' own tests: an in-memory transport and a one-shot relay.

Example (with pytest-django; the relay reads through the system alias, so the
messages must be committed, as in a transactional test)::

    from outbox.testing import InMemoryTransport, relay_pending

    def test_order_announces_itself(transactional_db):
        create_order(...)
        sent = relay_pending()
        assert [m.topic for m in sent] == ["order.created"]
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from outbox.stream import Message
from outbox.transports import Transport


class BrokerDown(ConnectionError):
    """Raised by :class:`InMemoryTransport` while it plays an unreachable broker."""


class InMemoryTransport(Transport):
    """Keeps what it is sent in :attr:`sent`; can play a broker that fails.

    Attributes:
        sent: every message sent, in order (duplicates included: a re-sent
            batch appears twice, as it would reach a real broker twice).
        failures: how many further calls to ``send`` raise :class:`BrokerDown`.
    """

    def __init__(self, failures: int = 0) -> None:
        self.sent: list[Message] = []
        self.failures = failures
        self.calls = 0
        self._lock = threading.Lock()

    def send(self, messages: Sequence[Message]) -> None:
        with self._lock:
            self.calls += 1
            if self.failures:
                self.failures -= 1
                raise BrokerDown("the in-memory broker is down")
            self.sent.extend(messages)

    @property
    def message_ids(self) -> list[str]:
        return [str(m.message_id) for m in self.sent]


def relay_pending(transport: Transport | None = None, name: str = "test") -> list[Message]:
    """Relay every committed message not yet relayed under ``name``; return them.

    Uses the system alias, like the real relay, and its own offset
    (``relay:<name>``), so it does not disturb a configured relay.
    """
    from outbox.relay import Relay

    memory = transport if transport is not None else InMemoryTransport()
    relay = Relay(memory, name=name)
    try:
        relay.drain()
    finally:
        relay.release()  # so that the next call relays at once
    return list(memory.sent) if isinstance(memory, InMemoryTransport) else []
