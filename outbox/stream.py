"""The outbox's messages as readers, handlers and transports see them.

:class:`Message` is a message with its payload decoded; :class:`Envelope` is
the same message as the JSON text that the relay sends; :class:`Batch` is
what one fenced read returns. The read itself, and why it never skips a
message committed late, is :func:`outbox.store.read_batch`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Generic, TypeVar

#: The keys of a message's envelope, in order: :meth:`Message.envelope` and the
#: JSON that PostgreSQL builds for the relay (:func:`outbox.store.read_envelopes`)
#: both follow this one list.
ENVELOPE_KEYS: tuple[str, ...] = (
    "id", "message_id", "tenant_id", "topic", "key", "aggregate_type", "aggregate_id",
    "payload", "headers", "created_at",
)

#: The envelope key of the relay's signature, after the others when
#: ``OUTBOX["SIGNING_KEYS"]`` is set (:mod:`outbox.signing`).
SIGNATURE = "signature"


@dataclass(frozen=True)
class Message:
    """One outbox message as readers and handlers see it.

    Attributes:
        id: the row's id, unique across tenants and increasing in insert
            order; readers follow the stream in id order, so it is also the
            message's position.
        message_id: a UUID unique to this message; receivers de-duplicate by it.
        tenant_id: the tenant that published it; handlers run as this tenant.
        topic: what happened, e.g. ``"order.created"``.
        key: the ordering key (messages with one key reach a consumer in order).
        xid: the publishing transaction's id (for people; it orders nothing).
        signature: the relay's signature of the envelope (:mod:`outbox.signing`),
            None when it was not signed.
    """

    id: int
    message_id: uuid.UUID
    tenant_id: int
    topic: str
    payload: Any
    key: str | None = None
    aggregate_type: str | None = None
    aggregate_id: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    xid: int = 0
    signature: str | None = None

    @property
    def position(self) -> int:
        """Where a reader that passed this message stands: its id."""
        return self.id

    def envelope(self) -> dict[str, Any]:
        """The message as a JSON-serialisable dict (what the Celery transport sends).

        The keys are :data:`ENVELOPE_KEYS`, in that order, then
        :data:`SIGNATURE` when the message is signed; the values are the
        attributes, but ``message_id`` as text and ``created_at`` as
        ``datetime.isoformat()`` writes it.
        """
        data = {key: getattr(self, key) for key in ENVELOPE_KEYS}
        data["message_id"] = str(self.message_id)
        data["created_at"] = self.created_at.isoformat() if self.created_at else None
        if self.signature is not None:
            data[SIGNATURE] = self.signature
        return data

    @classmethod
    def from_envelope(cls, data: dict[str, Any]) -> Message:
        created = data.get("created_at")
        return cls(
            id=int(data["id"]),
            message_id=uuid.UUID(str(data["message_id"])),
            tenant_id=int(data["tenant_id"]),
            topic=data["topic"],
            payload=data.get("payload"),
            key=data.get("key"),
            aggregate_type=data.get("aggregate_type"),
            aggregate_id=data.get("aggregate_id"),
            headers=data.get("headers") or {},
            created_at=datetime.fromisoformat(created) if created else None,
            signature=data.get(SIGNATURE),
        )


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message as the relay reads it for a transport that sends JSON.

    PostgreSQL builds the envelope (:meth:`Message.envelope`) as JSON text,
    so the payload passes through the relay as text, never parsed and
    serialised again. The JSON is the same envelope: the same keys in the
    same order, ``created_at`` in UTC as ``datetime.isoformat()`` writes it;
    only the spacing differs, and the payload is exactly what PostgreSQL
    stored (numbers are not rounded through a Python float). The relay
    appends the signature to the text when it signs (:mod:`outbox.signing`).

    Attributes:
        id: the message's id, its position in the stream.
        xid: the publishing transaction's id.
        message_id: the message's UUID as text.
        topic: its topic (transports route by it).
        json: the envelope as JSON text.
    """

    id: int
    xid: int
    message_id: str
    topic: str
    json: str

    @property
    def position(self) -> int:
        return self.id

    def data(self) -> dict[str, Any]:
        """The envelope as a dict, as :meth:`Message.envelope` returns it."""
        return json.loads(self.json)  # type: ignore[no-any-return]

    def message(self) -> Message:
        """The :class:`Message` (payload and headers decoded)."""
        return replace(Message.from_envelope(self.data()), xid=self.xid)

    @classmethod
    def of(cls, message: Message) -> Envelope:
        return cls(message.id, message.xid, str(message.message_id), message.topic,
                   json.dumps(message.envelope()))


M = TypeVar("M", Message, Envelope)


@dataclass(frozen=True)
class Batch(Generic[M]):
    """Messages read in one round trip, and the fence they were read below.

    Attributes:
        messages: in id order.
        fence: the first id that was not readable: no message with a smaller
            id can still appear (:func:`outbox.store.read_batch` says why).
    """

    messages: list[M]
    fence: int

    @property
    def passed(self) -> int:
        """The position just below the fence.

        A reader that asked for ``limit`` messages and got fewer has seen
        every message it selects below the fence, so it may move to here even
        when none matched its topics or partition (else a consumer of a rare
        topic would pin retention, and re-scan the same rows on every poll).
        """
        return self.fence - 1
