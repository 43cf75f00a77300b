"""The Celery transport's Redis fast path writes what kombu would write.

The relay reads each message as its envelope's JSON built by PostgreSQL
(outbox.stream.Envelope) and, on kombu's Redis transport, pushes the whole
batch with one LPUSH per list (outbox.transports._RedisWire). These tests hold
it to the standard path: the same envelope, the same Redis message (but for
kombu's random delivery tag), the same order, the same lists; and a real
worker runs the tasks.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import uuid
from typing import Any

import kombu
import pytest
import redis
from celery import Celery
from django.conf import settings as django_settings
from kombu import Exchange, Queue

from outbox.relay import Relay
from outbox.store import read_batch, read_envelopes
from outbox.stream import Envelope, Position
from outbox.transports import CeleryTransport, _RedisWire
from tenancy.aliases import system_alias
from tests.helpers import observer
from tests.outbox.support.faulty_transports import DieAfterSend
from tests.outbox.support.helpers import (
    ORDER_WORKER_APP,
    SUBPROCESS_SETTINGS,
    Process,
    effects,
    publish_as,
    publish_many,
    wait_for,
)

A, B = 1, 2

#: kombu 5.7 says when a Redis channel may pipeline publishes
#: (Channel.supports_batch_publish); before it, the fast path stays off and
#: every batch takes kombu's own path (tox -e oldest runs that way).
KOMBU_BATCHES = tuple(int(part) for part in kombu.__version__.split(".")[:2]) >= (5, 7)
needs_kombu_batches = pytest.mark.skipif(
    not KOMBU_BATCHES, reason=f"the Redis fast path needs kombu 5.7+ (kombu {kombu.__version__})")
PAYLOADS: list[Any] = [
    {"sku": "a", "n": 1},
    {"text": "déjà vu ✓ \u2028 \"quoted\" \\ back\nslash", "empty": {}, "list": [1, 2.5, None]},
    {"big": 12345678901234567890, "float": 0.1, "neg": -3e-7, "bool": True},
    [1, "two", {"three": 3}],
    "a string payload",
    None,
]


def raw_items(key: str) -> list[bytes]:
    """The Redis list's items as written, oldest first (the order BRPOP takes them)."""
    client = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    try:
        items = client.lrange(key, 0, -1)
        client.delete(key)
    finally:
        client.close()
    return list(reversed(items))


def raw_messages(key: str) -> list[dict[str, Any]]:
    """The Redis list's messages, oldest first (the order BRPOP takes them)."""
    return [json.loads(item) for item in raw_items(key)]


def masked(item: bytes) -> str:
    """A Redis item as written, but for its body and kombu's random delivery tag.

    The body's base64 differs legitimately (the fast path puts PostgreSQL's
    envelope JSON in as text: other spacing); it is compared decoded.
    """
    message = json.loads(item)
    text = item.decode()
    for value in (message["body"], message["properties"]["delivery_tag"]):
        assert text.count(json.dumps(value)) == 1
        text = text.replace(json.dumps(value), '"..."')
    return text


def body_in_order(message: dict[str, Any]) -> Any:
    """The decoded body with every object as its list of (key, value) pairs: key order counts."""
    return json.loads(base64.b64decode(message["body"]), object_pairs_hook=list)


def decoded(message: dict[str, Any]) -> dict[str, Any]:
    """A Redis message with its body decoded and kombu's random delivery tag dropped."""
    assert message["properties"]["body_encoding"] == "base64"
    body = json.loads(base64.b64decode(message["body"]))
    properties = {k: v for k, v in message["properties"].items() if k != "delivery_tag"}
    return {**message, "body": body, "properties": properties}


def standard_path(monkeypatch):
    monkeypatch.setattr(_RedisWire, "for_producer", classmethod(lambda cls, producer: None))


def test_postgresql_builds_the_envelope_the_relay_sent_before():
    ids = [publish_as(A, "order.placed", p, key="k:1", aggregate_type="order",
                      aggregate_id=7, headers={"trace": "t-1", "n": [1]}) for p in PAYLOADS]
    ids.append(publish_as(B, "order.placed", {"x": 1}))
    with observer() as conn:  # a whole second: isoformat() then writes no fraction
        conn.execute("UPDATE outbox_messages SET created_at = date_trunc('second', created_at)"
                     " WHERE message_id = %s", [ids[-1]])
        conn.execute("UPDATE outbox_messages SET headers = 'null'::jsonb"
                     " WHERE message_id = %s", [ids[0]])
        conn.execute("UPDATE outbox_messages SET created_at = '2026-01-02 03:04:05.000123+00'"
                     " WHERE message_id = %s", [ids[1]])  # a fraction with leading zeros
    wait_for(lambda: len(read_batch(system_alias(), Position(), 100).messages) == len(ids),
             "fenced")
    messages = read_batch(system_alias(), Position(), 100).messages
    envelopes = read_envelopes(system_alias(), Position(), 100).messages
    assert [e.message_id for e in envelopes] == [str(i) for i in ids]
    assert [e.position for e in envelopes] == [m.position for m in messages]
    assert [e.topic for e in envelopes] == [m.topic for m in messages]
    for envelope, message in zip(envelopes, messages, strict=True):
        assert envelope.data() == message.envelope()
        assert list(envelope.data()) == list(message.envelope())  # same key order
        assert envelope.message() == message
    assert "." not in envelopes[-1].data()["created_at"]
    assert envelopes[1].data()["created_at"] == "2026-01-02T03:04:05.000123+00:00"


@needs_kombu_batches
def test_the_fast_path_writes_the_message_kombu_writes(queue, monkeypatch):
    publish_many(A, "order.placed", [{"sku": f"s{i}", "p": p} for i, p in enumerate(PAYLOADS)])
    wait_for(lambda: len(read_envelopes(system_alias(), Position(), 100).messages) == len(PAYLOADS),
             "fenced")
    envelopes = read_envelopes(system_alias(), Position(), 100).messages
    messages = read_batch(system_alias(), Position(), 100).messages
    sent = []
    monkeypatch.setattr(_RedisWire, "send", _spy(_RedisWire.send, sent))
    CeleryTransport().send_envelopes(envelopes)
    assert sent == [True]  # the fast path ran...
    fast_items = raw_items(queue)
    fast = [json.loads(item) for item in fast_items]
    standard_path(monkeypatch)
    CeleryTransport().send(messages)  # ...and this is kombu's Producer.publish
    standard_items = raw_items(queue)
    standard = [json.loads(item) for item in standard_items]
    assert len(fast) == len(standard) == len(PAYLOADS)
    assert [decoded(m) for m in fast] == [decoded(m) for m in standard]
    # Byte for byte (kombu's JSON of the message: keys, order, spacing), but
    # for the body's base64 and the delivery tag; the body in key order.
    assert [masked(item) for item in fast_items] == [masked(item) for item in standard_items]
    assert [body_in_order(m) for m in fast] == [body_in_order(m) for m in standard]
    assert len({m["properties"]["delivery_tag"] for m in fast}) == len(fast)
    first = decoded(fast[0])
    assert first["headers"]["id"] == first["properties"]["correlation_id"] == str(
        messages[0].message_id)
    assert first["properties"]["delivery_info"] == {"exchange": "", "routing_key": queue}
    assert first["body"][0] == [messages[0].envelope()]


def _spy(method, calls):
    def spy(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        calls.append(result)
        return result

    return spy


def test_a_relayed_batch_keeps_its_order_in_the_list(queue):
    ids = publish_many(A, "order.placed", [{"n": n} for n in range(250)])
    relay = Relay(name="wire-order", batch_size=100)
    wait_for(lambda: relay.drain() >= 0 and relay.sent == 250, "relayed")
    assert [m["headers"]["id"] for m in raw_messages(queue)] == [str(i) for i in ids]


def test_queues_of_several_lists_and_priorities_in_one_batch(settings):
    """Routes to two queues, one of them with a priority: one LPUSH per Redis list."""
    names = [f"dio-outbox-wire-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    app = Celery("wire", broker=django_settings.CELERY_BROKER_URL, set_as_current=False)
    app.conf.task_queues = [Queue(n, Exchange(n), routing_key=n) for n in names]
    app.conf.task_routes = {"t.first": {"queue": names[0]}, "t.second": {"queue": names[1]}}
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": None,
                       "CELERY_TASK": {"second": "t.second", "*": "t.first"}}
    ids = publish_many(A, "first", [{"n": n} for n in range(3)])
    ids += publish_many(A, "second", [{"n": n} for n in range(2)])
    transport = CeleryTransport(app)
    relay = Relay(transport, name="wire-queues")
    try:
        wait_for(lambda: relay.drain() >= 0 and relay.sent == 5, "relayed")
        first, second = raw_messages(names[0]), raw_messages(names[1])
    finally:
        app.close()
    assert [m["headers"]["id"] for m in first] == [str(i) for i in ids[:3]]
    assert [m["headers"]["id"] for m in second] == [str(i) for i in ids[3:]]
    assert {m["headers"]["task"] for m in second} == {"t.second"}


@needs_kombu_batches
def test_a_failure_part_way_through_a_batch_raises_and_the_whole_batch_is_sent_again(
        settings, caplog):
    """docs/outbox.md: several lists, one LPUSH failed: the batch raises and goes again.

    The relay connects as a Redis user that may read the second list but not write it
    (an ACL of its own), so the first list's LPUSH succeeds and the second's is refused.
    """
    tag = uuid.uuid4().hex[:8]
    names = [f"dio-wire-ok-{tag}", f"dio-wire-ro-{tag}"]
    user = f"dio-wire-{tag}"
    admin = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    admin.acl_setuser(user, enabled=True, nopass=True, commands=["+@all"],
                      keys=["_kombu*", f"dio-wire-ok-{tag}*", f"%R~dio-wire-ro-{tag}*"])
    url = django_settings.CELERY_BROKER_URL.replace("redis://", f"redis://{user}:x@", 1)
    app = Celery("wire", broker=url, set_as_current=False)
    app.conf.task_queues = [Queue(n, Exchange(n), routing_key=n) for n in names]
    app.conf.task_routes = {"t.first": {"queue": names[0]}, "t.second": {"queue": names[1]}}
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": None,
                       "CELERY_TASK": {"*": "t.first", "second": "t.second"}}
    ids = publish_many(A, "first", [{"n": n} for n in range(3)])
    ids += publish_many(A, "second", [{"n": n} for n in range(2)])
    relay = Relay(CeleryTransport(app), name="wire-part-way")
    try:
        wait_for(lambda: relay.step() is not None and "could not send 5 message(s)" in caplog.text,
                 "the failed send")
        assert "(LPUSH dio-wire-ro-" in caplog.text, caplog.text  # refused at its LPUSH
        assert admin.llen(names[0]) == 3  # the first list took its part of the batch...
        with observer() as conn:  # ...but the relay did not move past any message of it
            assert conn.execute("SELECT count(*) FROM consumer_offsets WHERE name = %s"
                                " AND last_id > 0", ["relay:wire-part-way"]).fetchone()[0] == 0
        admin.acl_setuser(user, enabled=True, nopass=True,  # the second list writable
                          keys=[f"dio-wire-ro-{tag}*"])
        wait_for(lambda: relay.step() is not None and relay.sent == 5, "relayed")
        first, second = raw_messages(names[0]), raw_messages(names[1])
    finally:
        relay.release()
        app.close()
        admin.delete(*names)
        admin.acl_deluser(user)
        admin.close()
    # The whole batch again: the first list has its messages twice (at least once).
    assert [m["headers"]["id"] for m in first] == [str(i) for i in ids[:3]] * 2
    assert [m["headers"]["id"] for m in second] == [str(i) for i in ids[3:]]


@needs_kombu_batches
def test_a_queue_with_x_expires_takes_the_standard_path(settings):
    name = f"dio-outbox-wire-{uuid.uuid4().hex[:8]}"
    app = Celery("wire", broker=django_settings.CELERY_BROKER_URL, set_as_current=False)
    app.conf.task_queues = [Queue(name, queue_arguments={"x-expires": 600_000})]
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": name}
    publish_many(A, "order.placed", [{"n": 1}])
    relay = Relay(CeleryTransport(app), name="wire-expires")
    client = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    try:
        wait_for(lambda: relay.drain() >= 0 and relay.sent == 1, "relayed")
        assert 0 < client.pttl(name) <= 600_000  # kombu's PEXPIRE: the standard path ran
        assert len(raw_messages(name)) == 1
    finally:
        client.delete(name)
        client.close()
        app.close()


def test_a_channel_that_writes_messages_its_own_way_is_left_to_kombu(queue):
    from kombu.transport import redis as kombu_redis

    class Plain(kombu_redis.Channel):  # kombu's channel, as configured for batches
        supports_batch_publish = True

    class Retrying(kombu_redis.Channel):  # e.g. retry_on_timeout: kombu would not batch
        supports_batch_publish = False

    class OwnPut(Plain):
        def _put(self, queue, message, **kwargs):
            return super()._put(queue, message, **kwargs)

    class Producer:
        channel = Plain.__new__(Plain)
        exchange = Exchange("")
        compression = None

    assert _RedisWire.for_producer(Producer()) is not None
    Producer.channel = OwnPut.__new__(OwnPut)
    assert _RedisWire.for_producer(Producer()) is None
    # every member the fast path stands in for, overridden by a subclass
    # (or by a kombu release that gives the Redis channel its own)
    for member in ("_put", "basic_publish", "_inplace_augment_message", "prepare_message"):
        kombus = getattr(kombu_redis.Channel, member)

        def delegating(self, *args, _kombus=kombus, **kwargs):  # harmless, yet not kombu's
            return _kombus(self, *args, **kwargs)

        own = type(f"Own_{member}", (Plain,), {member: delegating})
        Producer.channel = own.__new__(own)
        assert _RedisWire.for_producer(Producer()) is None, member
    Producer.channel = Retrying.__new__(Retrying)
    assert _RedisWire.for_producer(Producer()) is None
    Producer.channel = Plain.__new__(Plain)
    Producer.compression = "zlib"
    assert _RedisWire.for_producer(Producer()) is None
    Producer.compression, Producer.exchange = None, Exchange("events", "topic")
    assert _RedisWire.for_producer(Producer()) is None


def test_a_subclass_that_overrides_send_still_sees_every_batch():
    class Counting(CeleryTransport):
        def send(self, messages):
            raise AssertionError("not reached")

    class Both(Counting):
        def send_envelopes(self, envelopes):
            raise AssertionError("not reached")

    assert CeleryTransport().reads_envelopes
    assert not Counting().reads_envelopes
    assert not DieAfterSend().reads_envelopes
    assert Both().reads_envelopes


def test_the_default_send_envelopes_decodes_for_transports_that_take_messages():
    from outbox.testing import InMemoryTransport

    published = publish_as(A, "order.placed", {"sku": "z"}, key="k")
    wait_for(lambda: len(read_envelopes(system_alias(), Position(), 10).messages) == 1, "fenced")
    [envelope] = read_envelopes(system_alias(), Position(), 10).messages
    memory = InMemoryTransport()
    memory.send_envelopes([envelope])
    assert memory.sent == read_batch(system_alias(), Position(), 10).messages
    assert Envelope.of(memory.sent[0]).data() == envelope.data()
    assert memory.message_ids == [str(published)]


@needs_kombu_batches
def test_a_celery_worker_runs_the_fast_paths_tasks_with_their_ids_and_envelopes(
    tmp_path, queue, monkeypatch
):
    sent = []
    monkeypatch.setattr(_RedisWire, "send", _spy(_RedisWire.send, sent))
    proc = Process(
        [sys.executable, "-m", "celery", "-A", ORDER_WORKER_APP, "worker",
         "-P", "solo", "-Q", queue, "--without-mingle", "--without-gossip",
         "--without-heartbeat", "-l", "info", "-n", f"{queue}@%h"],
        tmp_path / "worker.log",
        env={**SUBPROCESS_SETTINGS, "DIO_CELERY_QUEUE": queue},
    )
    proc.wait_output("ready.")
    try:
        ids = publish_many(A, "order.placed", [{"sku": f"a{i}"} for i in range(20)])
        ids += publish_many(B, "order.placed", [{"sku": "é✓"}])
        relay = Relay(name="wire-worker")
        wait_for(lambda: relay.drain() >= 0 and len(effects()) == 21, "the worker's effects")
    finally:
        assert proc.stop() == 0
    assert sent and all(sent)
    assert effects() == {str(i): 1 for i in ids}  # the envelope reached the task intact
    ran = re.findall(r"Task tests\.outbox\.receive_order\[([0-9a-f-]+)\] succeeded",
                     proc.output)
    assert ran == [str(i) for i in ids]  # task id = message id, in order
    with observer() as conn:
        rows = conn.execute("SELECT tenant_id, sku FROM testapp_order ORDER BY id").fetchall()
    assert rows[-1] == (B, "é✓")
    assert sorted({r[0] for r in rows}) == [A, B]


@pytest.mark.skipif(KOMBU_BATCHES, reason="kombu 5.7+ batches: the fast path is on")
def test_before_kombu_batches_every_batch_takes_kombus_own_path(queue, monkeypatch):
    sent = []
    monkeypatch.setattr(_RedisWire, "send", _spy(_RedisWire.send, sent))
    ids = publish_many(A, "order.placed", [{"sku": "a"}, {"sku": "b"}])
    relay = Relay(CeleryTransport(), name="wire-old-kombu")
    wait_for(lambda: relay.drain() >= 0 and relay.sent == 2, "relayed")
    assert sent == []  # the fast path never ran...
    messages = [decoded(json.loads(item)) for item in raw_items(queue)]
    assert [m["headers"]["id"] for m in messages] == [str(i) for i in ids]  # ...kombu sent both
