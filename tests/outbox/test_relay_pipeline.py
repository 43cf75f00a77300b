"""The relay's two shortcuts change its speed, never what it delivers.

- The Celery transport's Redis fast path builds each task's message once per
  batch, with holes for what varies (``outbox.transports._Template``): the
  bytes it writes are the bytes the same steps write message by message (and
  tests/outbox/test_redis_wire.py holds those to kombu's ``Producer.publish``);
  a template whose holes are not where Celery's steps put them is not used.
- The relay reads its next batch on a thread of its own while the broker takes
  the current one (``outbox.relay._ReadAhead``): a read made for a position
  the round does not end at is dropped, and the thread's connection is closed
  when the relay stops.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from outbox.relay import Relay, _ReadAhead
from outbox.store import read_envelopes
from outbox.stream import Position
from outbox.testing import InMemoryTransport
from outbox.transports import CeleryTransport, _Template
from tenancy.aliases import system_alias
from tests.helpers import observer
from tests.outbox.support.helpers import publish_many, wait_for
from tests.outbox.test_redis_wire import PAYLOADS, masked, needs_kombu_batches, raw_items

A = 1


def sent_whole_and_by_template(queue: str, monkeypatch: Any) -> tuple[list[bytes], list[bytes]]:
    publish_many(A, "order.placed", [{"p": p} for p in PAYLOADS] * 3)
    count = len(PAYLOADS) * 3
    wait_for(lambda: len(read_envelopes(system_alias(), Position(), 100).messages) == count,
             "fenced")
    envelopes = read_envelopes(system_alias(), Position(), 100).messages
    fills: list[str] = []
    original = _Template.fill

    def counted(self: _Template, item: Any) -> tuple[str, str]:
        fills.append(item.message_id)
        return original(self, item)

    monkeypatch.setattr(_Template, "fill", counted)
    CeleryTransport().send_envelopes(envelopes)
    assert fills == [e.message_id for e in envelopes]  # every message from the template
    by_template = raw_items(queue)
    monkeypatch.setattr(_Template, "of", classmethod(lambda cls, built, dumps: None))
    CeleryTransport().send_envelopes(envelopes)
    whole = raw_items(queue)
    return whole, by_template


@needs_kombu_batches
def test_the_template_writes_what_each_message_built_whole_writes(queue, monkeypatch):
    whole, by_template = sent_whole_and_by_template(queue, monkeypatch)
    assert len(whole) == len(by_template) == len(PAYLOADS) * 3
    # Byte for byte but for kombu's random delivery tag (the body compared whole here:
    # both put PostgreSQL's envelope text in as it is).
    def tagless(item: bytes) -> str:
        tag = json.loads(item)["properties"]["delivery_tag"]
        return item.decode().replace(json.dumps(tag), '"..."')

    assert [tagless(i) for i in by_template] == [tagless(i) for i in whole]
    assert [masked(i) for i in by_template] == [masked(i) for i in whole]
    tags = [json.loads(i)["properties"]["delivery_tag"] for i in by_template]
    assert len(set(tags)) == len(tags)  # a new tag per message, as kombu gives


def test_a_template_whose_holes_are_not_where_expected_is_not_used():
    built = ("q", json.dumps({"body": "W1tdLHt9XQ==", "headers": {"id": _Template.ID},
                              "properties": {"delivery_tag": "t"}}))
    assert _Template.of(built, json.dumps) is None  # the body is not [[BODY], ...]
    body = base64.b64encode(f"[[{_Template.BODY}],{{}},{{}}]".encode()).decode()
    twice = ("q", json.dumps({"body": body, "headers": {"id": _Template.ID, "argsrepr":
                              _Template.ARGSREPR, "copy": _Template.ARGSREPR},
                              "properties": {"delivery_tag": "t", "correlation_id": _Template.ID,
                                             "root": _Template.ID}}))
    assert _Template.of(twice, json.dumps) is None  # argsrepr copied elsewhere: not used


def test_a_relay_reads_ahead_and_sends_everything_once_in_order():
    ids = publish_many(A, "t", [{"n": n} for n in range(95)])
    memory = InMemoryTransport()
    relay = Relay(memory, name="ahead", batch_size=10)
    taken: list[bool] = []
    original = _ReadAhead.take

    def spy(self: _ReadAhead, position: Position) -> Any:
        batch = original(self, position)
        taken.append(batch is not None)
        return batch

    _ReadAhead.take = spy  # type: ignore[method-assign]
    try:
        wait_for(lambda: relay.drain() >= 0 and len(memory.sent) >= 95, "relayed")
    finally:
        _ReadAhead.take = original  # type: ignore[method-assign]
    assert memory.message_ids == [str(i) for i in ids]
    assert sum(taken) >= 8  # the batches after a full one came from the read-ahead


def test_a_read_ahead_for_another_position_is_dropped_after_a_broker_failure():
    ids = publish_many(A, "t", [{"n": n} for n in range(30)])
    memory = InMemoryTransport(failures=1)  # the first batch fails once; its read-ahead is dropped
    relay = Relay(memory, name="ahead-fail", batch_size=10)
    wait_for(lambda: relay.drain() >= 0 and len(memory.sent) >= 30, "relayed")
    assert memory.message_ids == [str(i) for i in ids]  # each once, in order
    assert memory.calls == 4


def system_sessions() -> int:
    from django.conf import settings

    role = settings.DATABASES[system_alias()]["USER"]
    with observer() as conn:
        return int(conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND pid <> pg_backend_pid()",
            [role]).fetchone()[0])


@pytest.mark.direct_sessions("system", reason="counts the system role's server sessions")
def test_the_read_ahead_thread_closes_its_connection_when_the_relay_stops():
    publish_many(A, "t", [{"n": n} for n in range(25)])
    before = system_sessions()
    memory = InMemoryTransport()
    relay = Relay(memory, name="ahead-close", batch_size=10)
    wait_for(lambda: relay.drain() >= 0 and len(memory.sent) >= 25, "relayed")
    # The relay's own connection stays (Django's, this thread's); the read-ahead's is gone.
    wait_for(lambda: system_sessions() <= before + 1, "the read-ahead's session closed")
