"""The outbox's messages as readers, handlers and transports see them.

:class:`Message` is a message with its payload decoded; :class:`Envelope` is
the same message as the JSON text that the relay sends; :class:`Batch` is
what one fenced read returns. The read itself, and why it never skips a
message committed late, is :func:`outbox.store.read_batch`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
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
        return cls(int(data["id"]), uuid.UUID(str(data["message_id"])), int(data["tenant_id"]),
                   data["topic"], data.get("payload"), data.get("key"),
                   data.get("aggregate_type"), data.get("aggregate_id"),
                   data.get("headers") or {}, datetime.fromisoformat(created) if created else None,
                   signature=data.get(SIGNATURE))


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
class Position:
    """Where a reader (a consumer partition or a relay) stands in the stream.

    The stream is read in id order, with a fence per tenant: while a
    transaction that published for a tenant is still open, that tenant's
    later messages wait for it, and the reader goes on with every other
    tenant's (:func:`outbox.store.read_batch` says why nothing is skipped).
    So a position is an id and the few tenants left behind it.

    Attributes:
        last: every message with an id at or below it has been passed, except
            those of the tenants in ``held``.
        held: tenant id -> the last id passed of that tenant's messages, below
            ``last``: a publisher of the tenant was in flight when the reader
            went past. Usually empty.
    """

    last: int = 0
    held: dict[int, int] = field(default_factory=dict)

    def of(self, tenant_id: int) -> int:
        """The last id passed of ``tenant_id``'s messages."""
        return self.held.get(tenant_id, self.last)

    def has_passed(self, message_id: int, tenant_id: int) -> bool:
        """Whether the message with this id, of this tenant, is behind the reader."""
        return message_id <= self.of(tenant_id)

    @property
    def floor(self) -> int:
        """The largest id such that every message at or below it has been passed."""
        return min(self.held.values(), default=self.last)

    def reaching(self, reach: int, in_flight: Mapping[int, int]) -> Position:
        """The position once the reader has passed every message it may pass up to ``reach``.

        A reader passes, of each tenant, the messages after its position up to
        ``reach``, but not past the bound of a publisher of that tenant still
        in flight (``in_flight``: tenant -> the lowest bound naming it, as the
        read saw them). Tenants it could not take as far as the others are
        held; a held tenant that caught up is dropped.
        """
        last = max(self.last, reach)
        held: dict[int, int] = {}
        for tenant in self.held.keys() | in_flight.keys():
            bound = in_flight.get(tenant)
            upto = reach if bound is None else min(reach, bound)
            passed = max(self.of(tenant), upto)
            if passed < last:
                held[tenant] = passed
        return Position(last, held)

    def json(self) -> str:
        """``held`` as the JSON object ``consumer_offsets.held`` keeps."""
        return json.dumps({str(tenant): upto for tenant, upto in sorted(self.held.items())})

    @classmethod
    def of_row(cls, last: int, held: Any) -> Position:
        """From ``consumer_offsets``' columns (``held`` as the JSON text or object read)."""
        data = json.loads(held) if isinstance(held, str | bytes) else (held or {})
        return cls(int(last), {int(tenant): int(upto) for tenant, upto in data.items()})

    def __str__(self) -> str:
        if not self.held:
            return str(self.last)
        behind = ", ".join(f"tenant {t} at {p}" for t, p in sorted(self.held.items()))
        return f"{self.last} ({behind})"


@dataclass(frozen=True)
class Batch(Generic[M]):
    """Messages read in one round trip, and what the read saw of the stream.

    Attributes:
        messages: in id order: the first ``limit`` messages the reader may
            pass next, of every tenant.
        allocated: the last id handed out when the read began (or, while a
            publisher that may write for any tenant is in flight, its bound):
            every message at or below it either was readable, or belongs to a
            publisher still in flight (``in_flight``), or was rolled back.
        in_flight: tenant -> the lowest bound of a publisher of that tenant
            still in flight: its messages above the bound may still commit.
        limit: how many messages were asked for.
    """

    messages: list[M]
    allocated: int
    in_flight: dict[int, int] = field(default_factory=dict)
    limit: int = 0

    @property
    def complete(self) -> bool:
        """Whether the read returned every message the reader may pass now (fewer than asked)."""
        return len(self.messages) < self.limit

    def position_after(self, position: Position, handled: int | None = None) -> Position:
        """Where a reader at ``position`` stands once it passed the first ``handled`` messages.

        ``handled`` defaults to all of them. When every message was passed and
        the read was complete, the reader moves up to ``allocated`` even if
        none matched its topics or partition (else a consumer of a rare topic
        would pin retention, and re-scan the same rows on every poll).
        """
        count = len(self.messages) if handled is None else handled
        if count == len(self.messages) and self.complete:
            return position.reaching(self.allocated, self.in_flight)
        if count == 0:
            return position
        return position.reaching(self.messages[count - 1].id, self.in_flight)
