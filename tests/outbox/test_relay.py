"""The relay: in order, at least once, nothing skipped when the broker fails."""

from __future__ import annotations

import logging
import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from outbox import receive, receiver
from outbox.relay import Relay
from outbox.stream import Message, Position
from outbox.testing import InMemoryTransport, relay_pending
from outbox.transports import CeleryTransport, LoggingTransport, get_transport
from tenancy import current_tenant_id
from tenancy.aliases import app_alias
from tests.helpers import count_rows, observer
from tests.outbox.support.helpers import effects, offset, publish_as, publish_many, wait_for
from tests.testapp.models import Order

# make test-variants runs the tests marked `variants` again: those that send a statement
# through the library's aliases, which a deployment variant can change (docs/contributing.md).

A, B = 1, 2


def drain_until(relay: Relay, memory: InMemoryTransport, count: int) -> None:
    wait_for(lambda: relay.drain() >= 0 and len(memory.sent) >= count, f"{count} sent")


@pytest.mark.variants
def test_relay_sends_every_tenants_messages_in_order_with_their_envelope():
    first = publish_as(A, "order.placed", {"sku": "a"}, key="order:1", aggregate_type="order",
                       aggregate_id=1, headers={"trace": "x"})
    second = publish_as(B, "order.placed", {"sku": "b"})
    memory = InMemoryTransport()
    relay = Relay(memory, name="test")
    drain_until(relay, memory, 2)
    assert memory.message_ids == [str(first), str(second)]
    envelope = memory.sent[0].envelope()
    assert envelope["tenant_id"] == A and envelope["key"] == "order:1"
    assert envelope["aggregate_type"] == "order" and envelope["aggregate_id"] == "1"
    assert envelope["headers"] == {"trace": "x"} and envelope["payload"] == {"sku": "a"}
    assert Message.from_envelope(envelope).message_id == first
    relay.drain()
    assert len(memory.sent) == 2


@pytest.mark.variants
def test_relay_batches_and_resumes_from_its_offset():
    ids = publish_many(A, "t", [{"n": n} for n in range(25)])
    memory = InMemoryTransport()
    relay = Relay(memory, name="test", batch_size=10)
    drain_until(relay, memory, 25)
    assert memory.message_ids == [str(i) for i in ids]
    relay.release()  # stopped
    more = publish_many(A, "t", [{"n": 25}])
    fresh = InMemoryTransport()  # a new relay process, same offset
    drain_until(Relay(fresh, name="test"), fresh, 1)
    assert fresh.message_ids == [str(more[0])]


@pytest.mark.variants
def test_broker_down_backs_off_and_retries_skipping_nothing(caplog):
    ids = publish_many(A, "t", [{"n": n} for n in range(3)])
    memory = InMemoryTransport(failures=3)
    relay = Relay(memory, name="test")
    with caplog.at_level(logging.WARNING, logger="outbox"):
        drain_until(relay, memory, 3)
    assert memory.calls == 4
    assert memory.message_ids == [str(i) for i in ids]
    assert "could not send 3 message(s)" in caplog.text
    assert offset("relay:test")[0] > 0


@pytest.mark.variants
def test_a_second_relay_waits_while_the_first_holds_the_lease():
    publish_many(A, "t", [{"n": 1}])
    first, second = InMemoryTransport(), InMemoryTransport()
    relay = Relay(first, name="test")
    drain_until(relay, first, 1)
    publish_many(A, "t", [{"n": 2}])
    Relay(second, name="test").drain()
    assert second.sent == []
    relay.release()  # a relay that stops hands over at once
    drain_until(Relay(second, name="test"), second, 1)
    assert [m.payload for m in second.sent] == [{"n": 2}]


@pytest.mark.variants
def test_a_relay_that_lost_its_lease_does_not_move_the_offset():
    publish_many(A, "t", [{"n": 1}])
    memory = InMemoryTransport()
    relay = Relay(memory, name="test")
    position = relay._claim()
    # another relay takes over (the first one's lease ran out) and moves on
    with observer() as conn:
        conn.execute("UPDATE consumer_offsets SET lease_owner = 'other', last_id = 99"
                     " WHERE name = 'relay:test'")
    assert position == Position()
    relay.drain()
    assert offset("relay:test")[0] == 99


@pytest.mark.variants
def test_relay_pending_helper_for_users_tests():
    published = publish_as(A, "order.placed", {"sku": "x"})
    wait_for(lambda: str(published) in [str(m.message_id) for m in relay_pending()],
             "the helper to see the message")


def test_logging_transport_logs_each_message(caplog):
    with caplog.at_level(logging.INFO, logger="outbox.transport"):
        LoggingTransport().send([Message(1, uuid.uuid4(), A, "order.placed", {"sku": "x"})])
    assert "topic=order.placed" in caplog.text


def test_transport_setting_must_name_a_transport(settings):
    settings.OUTBOX = {**settings.OUTBOX, "TRANSPORT": "builtins.dict"}
    with pytest.raises(ImproperlyConfigured, match="not an outbox Transport"):
        get_transport()


def test_celery_transport_needs_a_task_for_every_topic(settings):
    settings.OUTBOX = {**settings.OUTBOX, "CELERY_TASK": {"order.placed": "x.placed"}}
    transport = CeleryTransport()
    assert transport.task_for("order.placed") == "x.placed"
    with pytest.raises(ImproperlyConfigured, match="no Celery task for topic 'other'"):
        transport.task_for("other")


@pytest.mark.variants
def test_relay_refuses_a_reader_under_row_level_security(settings):
    settings.TENANCY = {**settings.TENANCY, "SYSTEM_DATABASE": app_alias()}
    with pytest.raises(ImproperlyConfigured, match="row-level security"):
        Relay(InMemoryTransport(), name="test").drain()


@pytest.mark.variants
def test_receiver_handles_a_message_once_however_often_it_arrives():
    message_id = publish_as(A, "order.placed", {"sku": "r"})
    envelope = Message(1, message_id, A, "order.placed", {"sku": "r"}).envelope()

    @receiver("test.receiver")
    def create(message: Message) -> int:
        return Order.objects.create(tenant_id=current_tenant_id(), sku="r",
                                    note=str(message.message_id)).pk

    assert create(envelope) is not None
    assert create(envelope) is None  # duplicate: skipped
    assert effects() == {str(message_id): 1}
    ran, _ = receive(envelope, lambda m: None, receiver="another.receiver")
    assert ran  # each receiver handles each message once


@pytest.mark.variants
def test_a_failing_receiver_rolls_back_its_record_so_the_retry_runs():
    envelope = Message(1, uuid.uuid4(), A, "order.placed", {}).envelope()

    def fail(message: Message) -> None:
        Order.objects.create(tenant_id=current_tenant_id(), sku="x", note="failed")
        raise RuntimeError("task failed")

    with pytest.raises(RuntimeError):
        receive(envelope, fail, receiver="r")
    assert count_rows("outbox_received") == 0 and effects() == {}
    ran, _ = receive(envelope, lambda m: None, receiver="r")
    assert ran


@pytest.mark.variants
def test_relay_outbox_command_once(settings, capsys):
    settings.OUTBOX = {**settings.OUTBOX, "TRANSPORT": "outbox.transports.LoggingTransport"}
    publish_many(A, "t", [{"n": 1}])
    call_command("relay_outbox", "--once")
    assert "message(s) sent" in capsys.readouterr().out


@pytest.mark.variants
def test_a_relay_whose_lease_another_relay_took_stops_sending(caplog):
    publish_many(A, "t", [{"n": 1}])
    memory = InMemoryTransport()
    relay = Relay(memory, name="test")
    drain_until(relay, memory, 1)
    with caplog.at_level(logging.WARNING, logger="outbox"):
        assert relay._claim() is not None  # holds the lease; its heartbeat renews it
        with observer() as conn:  # another relay took over (its lease had run out)
            conn.execute("UPDATE consumer_offsets SET lease_owner = 'other',"
                         " lease_until = now() + interval '1 minute' WHERE name = 'relay:test'")
        wait_for(lambda: relay._heartbeat is not None and relay._heartbeat.lost.is_set(),
                 "the heartbeat to notice")
        publish_many(A, "t", [{"n": 2}])
        relay.drain()
    relay.release()
    assert len(memory.sent) == 1  # nothing sent once the lease was another's
    assert "lost its lease to another relay" in caplog.text
