"""Debezium carries the outbox (docs/debezium.md): the library's side of that road.

With ``OUTBOX["REPLICATION_SLOT"]`` set, a connector reads ``outbox_messages``
from the WAL and no relay runs: ``publish()`` signs each message itself
(:func:`signed_headers`); :func:`message_from_record` turns a record of the
outbox event router into the :class:`~outbox.stream.Message` a receiver takes,
its signature checked; retention and health read the slot (:func:`slot_state`);
:func:`migration_source` writes the opt-in migration
(``manage.py outbox_debezium_migration``).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from outbox import signing
from outbox.conf import SigningKey, outbox_settings
from outbox.exceptions import BadSignature
from outbox.store import SQL
from outbox.stream import ENVELOPE_KEYS, Message
from tenancy.statements import affected, fetch_one

#: The key of ``headers`` that carries the publisher's signature.
SIGNATURE_HEADER = "outbox-signature"

#: The scheme of the publisher's signature: ``r1.<key id>.<64 hex digits>``.
SCHEME = "r1"

_DJANGO = DjangoJSONEncoder()

#: The Kafka headers the connector configuration of docs/debezium.md writes:
#: ``id`` is the outbox event router's event id (``table.field.event.id``),
#: the others come from ``table.fields.additional.placement``.
HEADERS = ("id", "tenant_id", "type", "outbox_id", "aggregate_type", "aggregate_id", "headers",
           "created_at")

Headers = Mapping[str, bytes | str | None] | Iterable[tuple[str, bytes | str | None]]


def _as_stored(value: Any) -> Any:
    """``value`` as a receiver decodes it after PostgreSQL stored it as jsonb.

    Encoded as ``publish()`` encodes it (Django's JSON encoder), then decoded
    as jsonb writes numbers back: a float Python writes with an exponent
    (``1e+16``: integral, at or above 10^16) comes back as an integer, and
    jsonb has no negative zero.
    """
    return json.loads(_DJANGO.encode(value), parse_float=_jsonb_number)


def _jsonb_number(text: str) -> int | float:
    if "e+" in text or "E+" in text:
        return int(Decimal(text))
    number = float(text)
    return 0.0 if number == 0 else number


def _mac(by: SigningKey, *, message_id: Any, tenant_id: int, topic: str, key: str | None,
         aggregate_type: str | None, aggregate_id: str | None, payload: Any,
         headers: Mapping[str, Any]) -> str:
    """The publisher's signature of the envelope but its id and time (the database gives them)."""
    return signing.mac({
        "message_id": str(message_id), "tenant_id": int(tenant_id), "topic": topic, "key": key,
        "aggregate_type": aggregate_type, "aggregate_id": aggregate_id, "payload": payload,
        "headers": _unsigned(headers),
    }, by, SCHEME, b"outbox row v1\n")


def _unsigned(headers: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in headers.items() if k != SIGNATURE_HEADER}


def signed_headers(fields: Mapping[str, Any], headers: dict[str, Any]) -> dict[str, Any]:
    """``headers`` with the publisher's signature, when a slot carries the messages.

    ``publish()`` calls it for every message, with the message's other columns
    (``fields``: ``message_id``, ``tenant_id``, ``topic``, ``key``,
    ``aggregate_type``, ``aggregate_id``, ``payload``). Unless
    ``OUTBOX["REPLICATION_SLOT"]`` and ``OUTBOX["SIGNING_KEYS"]`` are both set it
    returns ``headers`` as they are. Otherwise it adds :data:`SIGNATURE_HEADER`:
    an HMAC-SHA256, with the first key, of everything the envelope says but the
    message's id and ``created_at`` (the database gives those after the
    signature is made), taken over the values as a receiver decodes them from
    the stored jsonb.

    Raises:
        TypeError: the payload or headers are not JSON-serialisable.
    """
    if outbox_settings.REPLICATION_SLOT is None:
        return headers
    keys = outbox_settings.SIGNING_KEYS
    if not keys:
        return headers
    stored = {**fields, "payload": _as_stored(fields["payload"]), "headers": _as_stored(headers)}
    return {**headers, SIGNATURE_HEADER: _mac(keys[0], **stored)}


def verify(data: Mapping[str, Any], keys: Sequence[SigningKey] | None = None) -> None:
    """Refuse an envelope (as :func:`envelope` returns it) that its publisher did not sign.

    Args:
        data: the envelope, its headers still holding :data:`SIGNATURE_HEADER`.
        keys: ``OUTBOX["SIGNING_KEYS"]`` when omitted; with none, every envelope passes.

    Raises:
        BadSignature: saying why, quoting nothing of the envelope but a key id.
    """
    keys = outbox_settings.SIGNING_KEYS if keys is None else keys
    if not keys:
        return
    headers = data.get("headers")
    mark = headers.get(SIGNATURE_HEADER) if isinstance(headers, Mapping) else None
    if mark is None:
        raise BadSignature("it carries no publisher's signature")
    assert isinstance(headers, Mapping)
    signing.verify_mark(mark, keys, SCHEME, lambda by: _mac(
        by, message_id=data["message_id"], tenant_id=data["tenant_id"], topic=data["topic"],
        key=data["key"], aggregate_type=data["aggregate_type"],
        aggregate_id=data["aggregate_id"], payload=data["payload"], headers=headers))


def _text(value: bytes | str | None) -> str | None:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _signed_envelope(value: bytes | str | None, headers: Headers,
                     key: bytes | str | None) -> dict[str, Any]:
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    found = {name: _text(text) for name, text in pairs if name in HEADERS}
    missing = [name for name in ("id", "tenant_id", "type", "outbox_id") if not found.get(name)]
    if missing:
        raise ValueError(f"not an outbox record: no {', '.join(missing)} header (the connector "
                         "configuration is in docs/debezium.md)")
    created = found.get("created_at")
    payload = _text(value)
    data = {
        "id": int(found["outbox_id"] or 0),
        "message_id": str(uuid.UUID(found["id"] or "")),
        "tenant_id": int(found["tenant_id"] or 0),
        "topic": found["type"],
        "key": _text(key),
        "aggregate_type": found.get("aggregate_type"),
        "aggregate_id": found.get("aggregate_id"),
        "payload": None if payload is None else json.loads(payload),
        "headers": json.loads(found.get("headers") or "{}") or {},
        "created_at": (datetime.fromisoformat(created).astimezone(UTC).isoformat()
                       if created else None),
    }
    return {name: data[name] for name in ENVELOPE_KEYS}


def envelope_from_record(value: bytes | str | None, headers: Headers,
                         key: bytes | str | None = None) -> dict[str, Any]:
    """The envelope the relay would have sent for a record of the outbox event router.

    Args:
        value: the record's value: the payload's JSON text
            (``value.converter`` ``StringConverter``).
        headers: the record's headers, a mapping or ``(name, value)`` pairs of
            bytes or text, as Kafka clients return them.
        key: the record's key: the message's ``key`` (``table.field.event.key``).

    Returns:
        The keys of :meth:`Message.envelope`, in order, with the same values
        (the publisher's signature left out of ``headers``); nothing is verified.

    Raises:
        ValueError: the record lacks the headers that the connector configuration
            of docs/debezium.md writes.
    """
    data = _signed_envelope(value, headers, key)
    return data | {"headers": _unsigned(data["headers"])}


def message_from_record(value: bytes | str | None, headers: Headers,
                        key: bytes | str | None = None, *,
                        by: str = "a Debezium record") -> Message:
    """The :class:`Message` of a record of the outbox event router, its signature checked.

    Hand it to your receivers as they are: a function decorated with
    :func:`outbox.receiver`, or :func:`outbox.receivers.receive`, takes a
    Message, runs its handler as the message's tenant and skips a message it
    has already handled (Debezium delivers at least once)::

        record = consumer.poll()                      # a Kafka client's record
        order_created(message_from_record(record.value(), record.headers(), record.key()))

    With ``OUTBOX["SIGNING_KEYS"]`` set, a record whose publisher's signature
    is missing, malformed, made with another key or does not match the record
    is refused (an ERROR names ``by`` and the message id), as a receiver
    refuses an envelope the relay did not sign.

    Raises:
        BadSignature: the signature does not verify.
        ValueError: not a record of the outbox (see :func:`envelope`).
    """
    data = _signed_envelope(value, headers, key)
    signing.check(data, by=by, verify=verify)
    return Message.from_envelope(data | {"headers": _unsigned(data["headers"])})


@dataclass(frozen=True)
class SlotState:
    """A logical replication slot as ``pg_replication_slots`` shows it.

    Attributes:
        name: the slot's name.
        active: a reader (the connector) is streaming from it now.
        wal_status: ``reserved``, ``extended``, ``unreserved`` or ``lost``
            (its WAL was removed: the reader cannot resume).
        passed_before: the slot has passed every transaction whose id is below
            this one (an xid8, as ``outbox_messages.xid``): its ``catalog_xmin``,
            which PostgreSQL moves only once the reader has confirmed a position
            past those transactions' commits.
        retained_bytes: WAL kept for the slot since the position it would
            restart from.
    """

    name: str
    active: bool
    wal_status: str | None
    passed_before: int | None
    retained_bytes: int | None


def slot_state(using: str, name: str | None = None) -> SlotState | None:
    """The slot ``name`` (``OUTBOX["REPLICATION_SLOT"]``) of this database; None: there is none."""
    name = outbox_settings.REPLICATION_SLOT if name is None else name
    if name is None:
        return None
    row = fetch_one(using, SQL["replication_slot"], {"slot": name})
    if row is None:
        return None
    active, wal_status, passed_before, retained = row
    return SlotState(name, bool(active), wal_status,
                     None if passed_before is None else int(passed_before),
                     None if retained is None else int(retained))


def delete_passed_messages(using: str, upto: int, passed_before: int, older_than: float,
                           limit: int) -> int:
    """Retention's batch when a slot carries the messages (see :mod:`outbox.retention`).

    Deletes up to ``limit`` messages at or below ``upto``, older than
    ``older_than`` seconds, whose transaction the slot has passed.

    Returns:
        How many were deleted (fewer than ``limit``: none is left).
    """
    params = {"upto": upto, "passed_before": str(passed_before), "older_than": older_than,
              "limit": limit}
    return affected(using, SQL["delete_decoded_messages"], params)


def slot_problems(using: str) -> list[str]:
    """What is wrong with ``OUTBOX["REPLICATION_SLOT"]``, one line each (empty: nothing, or
    no slot configured): missing, read by no connector, or its WAL removed."""
    name = outbox_settings.REPLICATION_SLOT
    if name is None:
        return []
    state = slot_state(using, name)
    where = f"replication slot {name}"
    if state is None:
        return [f"{where}: does not exist in this database (the connector's slot.name); "
                "no message is reaped until it does"]
    problems: list[str] = []
    if state.wal_status == "lost":
        problems.append(f"{where}: its WAL was removed (wal_status lost): the connector cannot "
                        "resume from it; messages it had not passed are still in the outbox "
                        "(docs/debezium.md)")
    if not state.active:
        retained = ("" if state.retained_bytes is None
                    else f", {state.retained_bytes} bytes of WAL kept for it")
        problems.append(f"{where}: no connector is reading from it{retained}; messages "
                        "wait in the outbox")
    return problems


def _identifiers(publication: str, role: str) -> None:
    """ValueError unless both are plain lower-case SQL identifiers (they are written into SQL)."""
    for value, what in ((publication, "the publication"), (role, "the connector's role")):
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", value):
            raise ValueError(f"{what} must be a lower-case SQL identifier (letters, digits, _), "
                             f"not {value!r}")


def forward_sql(publication: str, role: str) -> str:
    """The SQL the opt-in migration runs (as the owner role, with migrate)."""
    _identifiers(publication, role)
    return f"""\
-- The connector's role logs in with REPLICATION; creating such a role takes a
-- superuser, so migrate (the owner) only checks that it is there:
--     CREATE ROLE {role} LOGIN REPLICATION PASSWORD '...';
DO $check$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}' AND rolreplication
                                          AND rolcanlogin) THEN
        RAISE EXCEPTION 'outbox: the role {role} (LOGIN REPLICATION) does not exist'
              USING HINT = 'As a superuser: CREATE ROLE {role} LOGIN REPLICATION '
                           'PASSWORD ''...''; then migrate again.';
    END IF;
END
$check$;

-- Inserts only: the outbox is append-only, and retention's deletes must not
-- reach the connector (the event router would drop them anyway). An insert-only
-- publication needs no replica identity beyond the table's own (its primary key).
CREATE PUBLICATION {publication} FOR TABLE outbox_messages WITH (publish = 'insert');

-- Debezium reads the table's columns when it starts; with snapshot.mode
-- no_data it reads no row (and row-level security would show it none).
GRANT SELECT ON outbox_messages TO {role};
"""


def reverse_sql(publication: str, role: str) -> str:
    """The SQL that undoes :func:`forward_sql` (``migrate <app> <previous>``)."""
    _identifiers(publication, role)
    return f"""\
REVOKE SELECT ON outbox_messages FROM {role};
DROP PUBLICATION IF EXISTS {publication};
"""


def migration_source(dependencies: Sequence[tuple[str, str]], publication: str,
                     role: str) -> str:
    """The text of the opt-in migration, depending on ``dependencies``."""
    forward = forward_sql(publication, role)
    reverse = reverse_sql(publication, role)
    return f'''\
"""Debezium reads outbox_messages: its publication and its role's grant.

Written by `manage.py outbox_debezium_migration` (django-idempotency-outbox,
docs/debezium.md). Review it, commit it, run migrate as the owner role;
`migrate <this app> <the previous migration>` undoes it.
"""

from django.db import migrations

FORWARD = """
{forward}"""

REVERSE = """
{reverse}"""


class Migration(migrations.Migration):
    dependencies = {list(dependencies)!r}

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
'''
