"""Pins the upstream behaviour that the outbox relies on without a promise from upstream.

Django, kombu and Celery do not document these as public API; a release may
change them. Each test here fails loudly, naming what moved, before the
library could go wrong quietly:

- Django: ``publish()`` looks for its wake-up among the connection's pending
  on-commit hooks (``connection.run_on_commit``: entries are tuples whose
  second item is the callable, and a rolled-back savepoint drops its hooks).
- kombu and Celery: the members that the Redis fast path
  (``outbox.transports._RedisWire``) calls exist and take the arguments it
  passes.

Pinned elsewhere, by behaviour:

- tests/outbox/test_redis_wire.py::test_the_fast_path_writes_the_message_kombu_writes:
  what the fast path LPUSHes equals, byte for byte, what kombu's own
  ``Producer.publish`` writes for the same message (but for the random
  delivery tag and the body's base64, whose JSON is compared decoded and in
  key order);
- test_redis_wire.py::test_a_channel_that_writes_messages_its_own_way_is_left_to_kombu:
  ``_RedisWire.for_producer`` falls back to kombu when any guarded member is
  overridden;
- test_redis_wire.py::test_postgresql_builds_the_envelope_the_relay_sent_before:
  the envelope JSON that PostgreSQL builds equals ``Message.envelope()``
  (unicode, big integers, nested JSON, null headers, ``created_at`` with and
  without a fraction).
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from celery import Celery
from django.conf import settings as django_settings
from django.db import transaction
from kombu import Queue

from outbox import publish
from outbox.publishing import _kick, wake_up
from tenancy import tenant_context
from tenancy.aliases import app_alias
from tests.helpers import app_atomic, app_connection
from tests.outbox.test_redis_wire import KOMBU_BATCHES

A = 1


def pending_hooks() -> list[Any]:
    """The callables Django will run when the current transaction commits."""
    entries = app_connection().run_on_commit
    assert isinstance(entries, list), type(entries)
    for entry in entries:
        assert isinstance(entry, tuple) and callable(entry[1]), entry
    return [entry[1] for entry in entries]


def first() -> None:
    pass


def second() -> None:
    pass


def test_django_keeps_pending_on_commit_hooks_as_tuples_with_the_callable_second():
    with app_atomic():
        transaction.on_commit(first, using=app_alias())
        assert pending_hooks() == [first]
        with app_atomic():  # a savepoint that is released keeps its hooks
            transaction.on_commit(second, using=app_alias())
        assert pending_hooks() == [first, second]
    assert app_connection().run_on_commit == []


def test_django_drops_the_hooks_of_a_rolled_back_savepoint():
    with app_atomic():
        transaction.on_commit(first, using=app_alias())
        with pytest.raises(RuntimeError), app_atomic():
            transaction.on_commit(second, using=app_alias())
            raise RuntimeError
        assert pending_hooks() == [first]


def test_a_publish_after_a_rolled_back_savepoint_still_wakes_the_relay():
    """The failure the scan would cause if Django kept a dropped hook around."""
    wake_up.clear()
    with tenant_context(A):
        with pytest.raises(RuntimeError), app_atomic():
            publish("order.placed", {"sku": "dropped"})
            assert pending_hooks().count(_kick) == 1
            raise RuntimeError
        assert _kick not in pending_hooks()
        publish("order.placed", {"sku": "kept"})
        publish("order.placed", {"sku": "also kept"})
        assert pending_hooks().count(_kick) == 1
    assert wake_up.is_set()


def test_a_transaction_whose_only_publish_was_rolled_back_wakes_nobody():
    wake_up.clear()
    with tenant_context(A):
        with pytest.raises(RuntimeError), app_atomic():
            publish("order.placed", {"sku": "dropped"})
            raise RuntimeError
    assert not wake_up.is_set()


def accepts(function: Any, *args: Any, **kwargs: Any) -> None:
    """Fail, naming ``function``, if it no longer takes these arguments."""
    try:
        inspect.signature(function).bind(*args, **kwargs)
    except TypeError as exc:
        signature = inspect.signature(function)
        raise AssertionError(f"{function.__qualname__}{signature}: {exc}") from exc


def test_kombu_and_celery_members_that_the_redis_fast_path_calls():
    from celery.utils.nodenames import anon_nodename
    from kombu.entity import maybe_delivery_mode
    from kombu.serialization import dumps as serialize
    from kombu.transport import redis as kombu_redis
    from kombu.transport.virtual import base as kombu_virtual
    from kombu.utils.json import dumps as json_dumps

    # guarded by identity in _RedisWire.for_producer
    for member in ("basic_publish", "_inplace_augment_message", "prepare_message"):
        assert callable(getattr(kombu_virtual.Channel, member, None)), member
    assert callable(getattr(kombu_redis.Channel, "_put", None))
    if KOMBU_BATCHES:  # kombu 5.7 added it; the fast path is off without it
        assert isinstance(kombu_redis.Channel.supports_batch_publish, property)
    else:
        assert not hasattr(kombu_redis.Channel, "supports_batch_publish")

    # called by _RedisWire.send, with these arguments
    channel_class = kombu_redis.Channel
    accepts(channel_class.prepare_message, None, "body", 0, "application/json", "utf-8", {}, {})
    accepts(channel_class._inplace_augment_message, None, {}, "", "queue")
    accepts(channel_class._get_message_priority, None, {}, reverse=False)
    accepts(channel_class._q_for_pri, None, "queue", 0)
    accepts(channel_class.conn_or_acquire, None)
    accepts(maybe_delivery_mode, 2)
    accepts(anon_nodename)
    assert serialize([], serializer="json")[:2] == ("application/json", "utf-8")
    assert json_dumps({"a": [1]}) == '{"a": [1]}'

    app = Celery("upstream", broker=django_settings.CELERY_BROKER_URL, set_as_current=False)
    try:
        headers, properties, body, _ = app.amqp.as_task_v2(
            "id-1", "t.name", args=(), kwargs={}, origin="origin", argsrepr="[]",
            kwargsrepr="{}",
        )
        args, kwargs, embed = body  # the fast path writes the args, then these two
        assert (headers["id"], headers["task"], args, kwargs) == ("id-1", "t.name", (), {})
        assert isinstance(properties, dict) and isinstance(embed, dict)
        with app.producer_or_acquire() as producer:
            channel = producer.channel
            assert isinstance(channel, kombu_redis.Channel)
            if KOMBU_BATCHES:  # queues with x-expires (kombu 5.7, with the batches)
                assert isinstance(channel._expires, dict)
            accepts(producer.maybe_declare, Queue("q"), retry=False)
            with channel.conn_or_acquire() as client:
                assert callable(client.lpush) and callable(client.pipeline)
    finally:
        app.close()
