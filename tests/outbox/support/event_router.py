"""Debezium's outbox event router, as docs/debezium.md configures it, in a few lines.

Debezium itself is Java and does not run here. This shapes a decoded insert
of ``outbox_messages`` into the Kafka record the router emits with the
connector configuration printed on docs/debezium.md (read from that page, so
the page and the tests cannot drift apart), as Debezium's documentation
describes it: the event id in the header ``id``, the key column as the
record's key, the payload column as the value, the topic from
``route.by.field`` through ``route.topic.replacement``, each
``table.fields.additional.placement`` column as a header; PostgreSQL's values
as Debezium represents them (``uuid``, ``jsonb`` and ``text`` as text,
``bigint`` as a number, ``timestamptz`` as an ISO-8601 string in UTC, the
``ZonedTimestamp`` of Java's ``ISO_OFFSET_DATE_TIME``); key, value and headers
as bytes, through ``StringConverter`` and Kafka Connect's
``SimpleHeaderConverter``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

PAGE = Path(__file__).resolve().parents[3] / "docs" / "debezium.md"
TABLE = "public.outbox_messages"


@dataclass(frozen=True)
class Record:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@cache
def connector() -> dict[str, str]:
    """The connector's configuration: the first JSON block of docs/debezium.md."""
    block = re.search(r"```json\n(.*?)```", PAGE.read_text(), re.S)
    assert block, "docs/debezium.md has no connector configuration"
    return json.loads(block.group(1))["config"]  # type: ignore[no-any-return]


def _zoned(text: str) -> str:
    # pgoutput writes timestamptz in the decoding session's style (ISO):
    # "2026-11-28 04:42:01.1234+00".
    moment = datetime.fromisoformat(text).astimezone(UTC)
    base = moment.strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    return f"{base}.{fraction}Z" if fraction else f"{base}Z"


def _header(column: str, value: str | None) -> bytes | None:
    if value is None:
        return None
    if column == "created_at":
        value = _zoned(value)
    return value.encode("utf-8")


def route(row: dict[str, str | None]) -> Record:
    """The record the router emits for one decoded insert of ``outbox_messages``."""
    config = connector()
    prefix = "transforms.outbox."
    option = {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix)}
    assert option["type"] == "io.debezium.transforms.outbox.EventRouter"
    assert config["table.include.list"] == TABLE
    routed = row[option.get("route.by.field", "aggregatetype")]
    assert routed is not None, "a message without the routing column has no topic"
    topic = option.get("route.topic.replacement", "outbox.event.${routedByValue}").replace(
        "${routedByValue}", routed)
    headers: list[tuple[str, bytes | None]] = [
        ("id", _header("id", row[option.get("table.field.event.id", "id")])),
    ]
    for placement in option.get("table.fields.additional.placement", "").split(","):
        column, where, *alias = placement.split(":")
        assert where == "header", placement
        headers.append((alias[0] if alias else column, _header(column, row[column])))
    key = row[option.get("table.field.event.key", "aggregateid")]
    value = row[option.get("table.field.event.payload", "payload")]
    return Record(topic, None if key is None else key.encode(),
                  None if value is None else value.encode(), headers)
