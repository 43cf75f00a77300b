"""The relay's signature on each envelope, and the receivers' check of it.

Anyone who can write to the broker's queues could hand a receiver an envelope
of their making, for any tenant. With ``OUTBOX["SIGNING_KEYS"]`` set, the relay
appends ``"signature": "v1.<key id>.<HMAC-SHA256>"`` to every envelope, and a
receiver refuses one that does not verify before anything runs or is written
as the tenant it names (docs/outbox.md, "Who may write to the broker"). The MAC
is over the envelope's other keys as JSON (unambiguous: keys sorted, no spaces,
non-ASCII escaped), of the values as a receiver decodes them: the relay decodes
PostgreSQL's JSON to sign it, whatever digits PostgreSQL wrote for a number.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, overload

from outbox.conf import SigningKey, outbox_settings
from outbox.exceptions import BadSignature
from outbox.stream import SIGNATURE, Batch, Envelope, Message

logger = logging.getLogger("outbox")

#: The scheme this module signs with and the only one it verifies.
SCHEME = "v1"

_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
_FORMAT = re.compile(r"([a-z][0-9])\.([0-9a-f]{8})\.([0-9a-f]{64})")  # scheme, key id, MAC


def mac(content: Mapping[str, Any], key: SigningKey, scheme: str = SCHEME,
        domain: bytes = b"outbox envelope v1\n") -> str:
    """``<scheme>.<key id>.<HMAC-SHA256 of domain + content's JSON>``: a signature of either
    scheme (the relay's, and the publisher's of :mod:`outbox.debezium`).

    Raises:
        TypeError, ValueError: a value that JSON cannot encode.
    """
    data = domain + _ENCODER.encode(content).encode("ascii")
    return f"{scheme}.{key.key_id}.{hmac.digest(key.secret, data, 'sha256').hex()}"


def signature(envelope: Mapping[str, Any], key: SigningKey) -> str:
    """The signature of ``envelope`` (its ``"signature"`` key, if any, left out) by ``key``."""
    return mac({name: value for name, value in envelope.items() if name != SIGNATURE}, key)


@overload
def signed(batch: Batch[Message], key: SigningKey) -> Batch[Message]: ...


@overload
def signed(batch: Batch[Envelope], key: SigningKey) -> Batch[Envelope]: ...


def signed(batch: Batch[Any], key: SigningKey) -> Batch[Any]:
    """``batch`` with each message signed by ``key`` (the relay's: the first of the list).

    A :class:`Message` gets its :attr:`~Message.signature`, which its
    envelope then carries; an :class:`Envelope`'s JSON, as PostgreSQL wrote
    it, is decoded to be signed and gets the signature appended as its last
    key, the rest of the text left as it was.
    """
    return replace(batch, messages=[
        _sign_envelope(item, key) if isinstance(item, Envelope)
        else replace(item, signature=signature(item.envelope(), key))
        for item in batch.messages
    ])


def _sign_envelope(envelope: Envelope, key: SigningKey) -> Envelope:
    text = envelope.json
    mark = signature(json.loads(text), key)
    end = text.rindex("}")
    return Envelope(envelope.id, envelope.xid, envelope.message_id, envelope.topic,
                    f'{text[:end]}, "{SIGNATURE}" : "{mark}"{text[end:]}')


def verify(envelope: Any, keys: Sequence[SigningKey] | None = None) -> None:
    """Refuse ``envelope`` unless one of ``keys`` signed it as it is.

    Args:
        envelope: what the broker delivered (a dict, as the relay sent it).
        keys: ``OUTBOX["SIGNING_KEYS"]`` when omitted. With no keys, every
            envelope passes, signed or not.

    Raises:
        BadSignature: saying why, in words that quote nothing of the envelope
            but a well-formed key id.
    """
    keys = outbox_settings.SIGNING_KEYS if keys is None else keys
    if not keys:
        return
    if not isinstance(envelope, Mapping):
        raise BadSignature(f"it is a {type(envelope).__name__}, not an envelope")
    mark = envelope.get(SIGNATURE)
    if mark is None:
        raise BadSignature("it carries no signature")
    verify_mark(mark, keys, SCHEME, lambda key: signature(envelope, key))


def verify_mark(mark: Any, keys: Sequence[SigningKey], scheme: str,
                expected: Callable[[SigningKey], str]) -> None:
    """Refuse ``mark`` unless it is ``expected(key)`` for the key of ``keys`` it names.

    Raises:
        BadSignature: saying why, quoting nothing of ``mark`` but a well-formed key id.
    """
    found = _FORMAT.fullmatch(mark) if isinstance(mark, str) else None
    if found is None or found.group(1) != scheme:
        raise BadSignature(f"its signature is malformed, or not of the scheme {scheme}")
    key = next((k for k in keys if k.key_id == found.group(2)), None)
    if key is None:
        raise BadSignature(f'it is signed with key {found.group(2)}, which is not in '
                           'OUTBOX["SIGNING_KEYS"]')
    try:
        correct = expected(key)
    except (KeyError, TypeError, ValueError) as exc:
        raise BadSignature("its content cannot be encoded to be verified") from exc
    if not hmac.compare_digest(correct, mark):
        raise BadSignature("its signature does not match its content")


def check(envelope: Any, *, by: str, verify: Callable[[Any], None] = verify) -> None:
    """``verify(envelope)``, logging a refusal as an ERROR that names ``by`` and the message id.

    The payload is never logged, and the message id only as a UUID (or quoted).
    """
    try:
        verify(envelope)
    except BadSignature as exc:
        logger.error("outbox: %s refused message %s: %s; it is not handled, retried or parked",
                     by, _message_id(envelope), exc)
        raise


def _message_id(envelope: Any) -> str:
    value = envelope.get("message_id") if isinstance(envelope, Mapping) else None
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        return f"{str(value)[:40]!r} (not a message id)"
