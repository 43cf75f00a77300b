"""The Celery transport on Redis writes what Celery's own ``send_task`` writes.

The relay reads each message as its envelope's JSON built by PostgreSQL
(outbox.stream.Envelope); the transport has Celery build the task message
around it and publishes it through kombu's ``Producer`` in one
``Producer.batch()`` (one pipeline per batch on kombu 5.7+). These tests hold
it to ``send_task``: the same envelope, the same Redis message (but for
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
from outbox.stream import Position
from outbox.transports import CeleryTransport
from tenancy.aliases import system_alias
from tests.helpers import observer
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


def body_in_order(message: dict[str, Any]) -> Any:
    """The decoded body with every object as its list of (key, value) pairs: key order counts."""
    return json.loads(base64.b64decode(message["body"]), object_pairs_hook=list)


def decoded(message: dict[str, Any]) -> dict[str, Any]:
    """A Redis message with its body decoded and kombu's random delivery tag dropped."""
    assert message["properties"]["body_encoding"] == "base64"
    body = json.loads(base64.b64decode(message["body"]))
    properties = {k: v for k, v in message["properties"].items() if k != "delivery_tag"}
    return {**message, "body": body, "properties": properties}


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


#: What Celery's ``send_task`` writes and the transport does not, and why: the
#: calling thread's reply queue (relayed tasks' results go to no caller), its
#: printable arguments copied into the properties (send_task passes its options
#: on as properties) and ``ignore_result`` as None (the transport's is False:
#: the worker stores results as the task says, as with None).
SEND_TASK_ONLY = {"properties": ("reply_to", "argsrepr", "kwargsrepr"),
                  "headers": ("ignore_result",)}


def but_send_task_only(message: dict[str, Any]) -> dict[str, Any]:
    message = decoded(message)
    for part, keys in SEND_TASK_ONLY.items():
        message[part] = {k: v for k, v in message[part].items() if k not in keys}
    return message


def test_the_transport_writes_the_message_send_task_writes(queue):
    publish_many(A, "order.placed", [{"sku": f"s{i}", "p": p} for i, p in enumerate(PAYLOADS)])
    wait_for(lambda: len(read_envelopes(system_alias(), Position(), 100).messages) == len(PAYLOADS),
             "fenced")
    envelopes = read_envelopes(system_alias(), Position(), 100).messages
    messages = read_batch(system_alias(), Position(), 100).messages
    transport = CeleryTransport()
    try:
        transport.send(envelopes)
    finally:
        transport.close()
    ours = raw_messages(queue)
    app, task = transport.app, transport.task_for("order.placed")
    for message in messages:  # Celery's own way, message by message
        app.send_task(task, args=[message.envelope()], task_id=str(message.message_id),
                      queue=queue, retry=False,
                      argsrepr=f"[<outbox message {message.message_id} {message.topic}>]",
                      kwargsrepr="{}")
    celerys = raw_messages(queue)
    assert len(ours) == len(celerys) == len(PAYLOADS)
    assert [but_send_task_only(m) for m in ours] == [but_send_task_only(m) for m in celerys]
    assert [body_in_order(m) for m in ours] == [body_in_order(m) for m in celerys]
    assert [list(m) for m in ours] == [list(m) for m in celerys]  # kombu's keys, in order
    assert len({m["properties"]["delivery_tag"] for m in ours}) == len(ours)
    first = decoded(ours[0])
    assert first["headers"]["id"] == first["properties"]["correlation_id"] == str(
        messages[0].message_id)
    assert first["properties"]["delivery_info"] == {"exchange": "", "routing_key": queue}
    assert first["properties"]["delivery_mode"] == 2
    assert first["body"][0] == [messages[0].envelope()]


def test_a_relayed_batch_keeps_its_order_in_the_list(queue):
    ids = publish_many(A, "order.placed", [{"n": n} for n in range(250)])
    relay = Relay(name="wire-order", batch_size=100)
    wait_for(lambda: relay.drain() >= 0 and relay.sent == 250, "relayed")
    assert [m["headers"]["id"] for m in raw_messages(queue)] == [str(i) for i in ids]


def test_queues_of_several_lists_and_priorities_in_one_batch(settings):
    """Routes to two queues by Celery's task_routes, in one batch."""
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


def test_a_failure_part_way_through_a_batch_raises_and_the_whole_batch_is_sent_again(
        settings, caplog):
    """docs/outbox.md: several lists, one refused: the batch raises and goes again.

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


@pytest.mark.skipif(tuple(int(p) for p in kombu.__version__.split(".")[:2]) < (5, 7),
                    reason=f"kombu {kombu.__version__}'s Redis queues have no x-expires (5.7+)")
def test_a_queue_with_x_expires_keeps_its_expiry(settings):
    name = f"dio-outbox-wire-{uuid.uuid4().hex[:8]}"
    app = Celery("wire", broker=django_settings.CELERY_BROKER_URL, set_as_current=False)
    app.conf.task_queues = [Queue(name, queue_arguments={"x-expires": 600_000})]
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_QUEUE": name}
    publish_many(A, "order.placed", [{"n": 1}])
    relay = Relay(CeleryTransport(app), name="wire-expires")
    client = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    try:
        wait_for(lambda: relay.drain() >= 0 and relay.sent == 1, "relayed")
        assert 0 < client.pttl(name) <= 600_000  # kombu's PEXPIRE
        assert len(raw_messages(name)) == 1
    finally:
        client.delete(name)
        client.close()
        app.close()


def test_a_celery_worker_runs_the_relayed_tasks_with_their_ids_and_envelopes(tmp_path, queue):
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
    assert effects() == {str(i): 1 for i in ids}  # the envelope reached the task intact
    ran = re.findall(r"Task tests\.outbox\.receive_order\[([0-9a-f-]+)\] succeeded",
                     proc.output)
    assert ran == [str(i) for i in ids]  # task id = message id, in order
    with observer() as conn:
        rows = conn.execute("SELECT tenant_id, sku FROM testapp_order ORDER BY id").fetchall()
    assert rows[-1] == (B, "é✓")
    assert sorted({r[0] for r in rows}) == [A, B]
