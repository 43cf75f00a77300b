"""Consumers: one transaction per batch, failures retried then parked, partitions."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from outbox.consumers import ConsumerConfigError, ensure_offsets, run_batch, select_consumers
from outbox.deadletters import list_parked, redrive
from outbox.models import DeadLetter
from tenancy import tenant_context
from tests.helpers import connect, count_rows, documented_sql, observer
from tests.outbox.support.helpers import (
    PATIENCE,
    SUBPROCESS_SETTINGS,
    Process,
    drain,
    effects,
    message_position,
    offset,
    publish_as,
    publish_many,
    raw_publish,
    wait_for,
)
from tests.outbox.support.recorders import FAILING, OrderRecorder, PartitionedRecorder

# make test-variants runs the tests marked `variants` again: those that send a statement
# through the library's aliases, which a deployment variant can change (docs/contributing.md).

A, B = 1, 2


def placed(*skus: str, tenant: int = A, **extra) -> list:
    return publish_many(tenant, "order.placed", [{"sku": s, **extra} for s in skus])


@pytest.mark.variants
def test_handler_writes_and_offset_commit_together():
    ids = placed("a", "b", "c")
    consumer = OrderRecorder()
    drain(consumer, until=lambda: len(effects()) == 3)
    assert effects() == {str(i): 1 for i in ids}
    assert offset("orders")[0] >= message_position(ids[-1])
    drain(consumer)  # nothing handled twice
    assert effects() == {str(i): 1 for i in ids}


@pytest.mark.variants
def test_handler_runs_as_the_messages_tenant():
    a = placed("a", tenant=A)[0]
    b = placed("b", tenant=B)[0]
    drain(OrderRecorder(), until=lambda: len(effects()) == 2)
    with observer() as conn:
        rows = dict(conn.execute("SELECT note, tenant_id FROM testapp_order").fetchall())
    assert rows == {str(a): A, str(b): B}


@pytest.mark.variants
def test_a_handler_that_raises_mid_batch_keeps_the_offset_at_the_last_good_message():
    FAILING.add("c")  # c fails until the test says otherwise
    ids = placed("a", "b", "c", "d")
    consumer = OrderRecorder()
    ensure_offsets(consumer)
    wait_for(lambda: run_batch(consumer).failed, "the first batch")
    # a and b committed; c's write was rolled back; d not handled yet
    assert effects() == {str(ids[0]): 1, str(ids[1]): 1}
    last_id, attempts = offset("orders")
    assert last_id == message_position(ids[1])
    assert attempts == 1
    FAILING.discard("c")
    drain(consumer, until=lambda: len(effects()) == 4)  # the retry succeeds and goes on
    assert effects() == {str(i): 1 for i in ids}
    assert offset("orders")[1] == 0


@pytest.mark.variants
def test_a_failing_head_message_waits_for_its_backoff(monkeypatch):
    monkeypatch.setattr(OrderRecorder, "retry_backoff", 3600)
    FAILING.add("a")
    placed("a")
    consumer = OrderRecorder()
    ensure_offsets(consumer)
    wait_for(lambda: run_batch(consumer).failed, "the failure")
    assert run_batch(consumer).waiting
    assert effects() == {}


@pytest.mark.variants
def test_the_retry_pause_doubles_up_to_its_maximum_while_the_partition_waits(monkeypatch):
    monkeypatch.setattr(OrderRecorder, "retry_backoff", 100)
    monkeypatch.setattr(OrderRecorder, "retry_backoff_max", 350)
    monkeypatch.setattr(OrderRecorder, "max_attempts", 10)
    FAILING.add("a")
    placed("a", "b")
    consumer = OrderRecorder()
    ensure_offsets(consumer)
    pauses = []
    for attempt in range(1, 5):
        wait_for(lambda: run_batch(consumer).failed, f"failure {attempt}")
        with observer() as conn:
            pauses.append(conn.execute(
                "SELECT attempts, extract(epoch FROM retry_at - now())::float"
                " FROM consumer_offsets WHERE name = 'orders'").fetchone())
            assert run_batch(consumer).waiting and effects() == {}  # b waits behind a
            conn.execute("UPDATE consumer_offsets SET retry_at = now() WHERE name = 'orders'")
    assert [n for n, _ in pauses] == [1, 2, 3, 4]
    assert [seconds for _, seconds in pauses] == pytest.approx([100, 200, 350, 350], abs=5)


@pytest.mark.variants
def test_a_poison_message_is_parked_after_the_retry_limit_and_later_messages_flow(monkeypatch):
    monkeypatch.setattr(OrderRecorder, "max_attempts", 3)
    before = placed("a")
    poison = placed("poison", poison=True)
    after = placed("b", "c")
    consumer = OrderRecorder()
    drain(consumer, until=lambda: len(effects()) == 3)
    assert effects() == {str(i): 1 for i in before + after}  # the poison's writes rolled back
    parked = list_parked()
    assert [(p.consumer, p.message_id, p.attempts) for p in parked] == [
        ("orders", str(poison[0]), 3)
    ]
    assert "poison message" in parked[0].error
    with tenant_context(A):
        row = DeadLetter.objects.get()
    assert row.payload == {"sku": "poison", "poison": True}


@pytest.mark.variants
def test_parked_messages_are_invisible_to_other_tenants(monkeypatch):
    monkeypatch.setattr(OrderRecorder, "max_attempts", 1)
    placed("poison", poison=True, tenant=A)
    drain(OrderRecorder(), until=lambda: count_rows("outbox_dead_letters") == 1)
    with tenant_context(B):
        assert DeadLetter.objects.count() == 0
    with connect() as conn:
        assert conn.execute("SELECT count(*) FROM outbox_dead_letters").fetchone()[0] == 0


@pytest.mark.variants
def test_redriving_a_parked_message_handles_it_once_and_removes_it(monkeypatch):
    monkeypatch.setattr(OrderRecorder, "max_attempts", 1)
    FAILING.add("flaky")
    ids = placed("flaky")
    drain(OrderRecorder(), until=lambda: count_rows("outbox_dead_letters") == 1)
    assert effects() == {}
    FAILING.discard("flaky")  # fixed
    result = redrive("orders")
    assert (result.handled, result.failed) == (1, 0)
    assert effects() == {str(ids[0]): 1}
    assert count_rows("outbox_dead_letters") == 0
    assert redrive("orders").handled == 0


@pytest.mark.variants
def test_redriving_a_message_that_fails_again_keeps_it_parked(monkeypatch):
    monkeypatch.setattr(OrderRecorder, "max_attempts", 1)
    placed("poison", poison=True)
    drain(OrderRecorder(), until=lambda: count_rows("outbox_dead_letters") == 1)
    result = redrive()
    assert (result.handled, result.failed) == (0, 1)
    assert list_parked()[0].attempts == 2
    assert effects() == {}


@pytest.mark.variants
def test_the_redrive_command_exits_non_zero_when_a_message_fails_again(monkeypatch, tmp_path):
    monkeypatch.setattr(OrderRecorder, "max_attempts", 1)
    placed("poison", poison=True)
    drain(OrderRecorder(), until=lambda: count_rows("outbox_dead_letters") == 1)
    command = Process.manage("outbox_parked", "--redrive", log=tmp_path / "redrive.log",
                             env=SUBPROCESS_SETTINGS)
    try:
        assert command.popen.wait(PATIENCE) == 1, command.output
    finally:
        command.kill()
    assert "1 parked message(s) failed again" in command.output
    assert list_parked()[0].attempts == 2 and effects() == {}


@pytest.mark.variants
def test_parked_command_lists_and_redrives(monkeypatch, capsys):
    monkeypatch.setattr(OrderRecorder, "max_attempts", 1)
    FAILING.add("flaky")
    placed("flaky")
    drain(OrderRecorder(), until=lambda: count_rows("outbox_dead_letters") == 1)
    FAILING.discard("flaky")
    call_command("outbox_parked")
    out = capsys.readouterr().out
    assert "orders  order.placed" in out and "1 parked message(s)" in out
    row = out.split()[0]
    call_command("outbox_parked", row, "--redrive")
    assert "1 handled" in capsys.readouterr().out
    with pytest.raises(CommandError, match="TENANT/ID"):
        call_command("outbox_parked", "nonsense", "--redrive")


@pytest.mark.variants
def test_without_its_offset_rows_a_batch_answers_locked_and_handles_nothing():
    placed("a")
    result = run_batch(OrderRecorder())
    assert result.locked and (result.handled, result.failed) == (0, False)
    assert effects() == {} and count_rows("consumer_offsets") == 0


@pytest.mark.variants
def test_a_partition_held_by_another_worker_is_skipped():
    placed("a")
    consumer = OrderRecorder()
    ensure_offsets(consumer)
    with connect("worker") as other, other.transaction():
        other.execute("SELECT 1 FROM consumer_offsets WHERE name = 'orders' FOR UPDATE")
        assert run_batch(consumer).locked
    assert effects() == {}


@pytest.mark.variants
def test_partitions_keep_per_key_order_and_cover_every_message():
    keys = [f"k{i}" for i in range(6)]
    payloads = [{"sku": k, "seq": n} for n in range(5) for k in keys]
    ids = publish_many(A, "order.sequenced", payloads, key=lambda p: p["sku"])
    consumer = PartitionedRecorder()
    drain(consumer, until=lambda: len(effects()) == len(ids))
    assert effects() == {str(i): 1 for i in ids}
    from tests.outbox.support.helpers import orders_by_key

    assert orders_by_key() == {k: [0, 1, 2, 3, 4] for k in keys}
    with observer() as conn:
        used = conn.execute(
            "SELECT count(*) FROM consumer_offsets WHERE name = 'orders-partitioned'"
            " AND last_id > 0"
        ).fetchone()[0]
    assert used > 1  # the keys spread over several partitions


@pytest.mark.variants
def test_changing_the_partition_count_is_refused():
    consumer = PartitionedRecorder()
    ensure_offsets(consumer)

    class Fewer(PartitionedRecorder):
        partitions = 2

    with pytest.raises(ConsumerConfigError, match="partition"):
        ensure_offsets(Fewer())


@pytest.mark.variants
def test_a_consumer_of_a_rare_topic_still_moves_past_other_messages():
    publish_many(A, "something.else", [{"n": n} for n in range(5)])
    consumer = OrderRecorder()
    ensure_offsets(consumer)
    last = message_position(publish_as(A, "something.else", {}))
    wait_for(lambda: run_batch(consumer) is not None and offset("orders")[0] >= last,
             "the offset to pass the unrelated messages")
    assert effects() == {}


@pytest.mark.variants
def test_run_consumers_refuses_a_system_alias_confined_by_rls_and_handles_nothing(settings):
    """docs/operations.md: each cross-tenant job refuses such an alias, in one line."""
    from tenancy.aliases import app_alias

    placed("confined")
    before = offset("orders")
    settings.TENANCY = {**settings.TENANCY, "SYSTEM_DATABASE": app_alias()}
    with pytest.raises(CommandError, match="row-level security") as refused:
        call_command("run_consumers", "orders", "--once")
    assert "\n" not in str(refused.value).strip()
    assert effects() == {} and offset("orders") == before


def test_unknown_consumer_names_are_refused():
    with pytest.raises(ConsumerConfigError, match="unknown consumer"):
        select_consumers(["nope"])
    with pytest.raises(CommandError, match="unknown consumer"):
        call_command("run_consumers", "nope", "--once")


@pytest.mark.variants
def test_run_consumers_once_drains_and_reports(capsys):
    ids = placed("a", "b")
    wait_for(lambda: call_command("run_consumers", "orders", "--once") is None
             and len(effects()) == 2, "both handled")
    assert effects() == {str(i): 1 for i in ids}
    assert "message(s) handled" in capsys.readouterr().out


@pytest.mark.variants
def test_a_new_consumer_started_now_with_the_documented_sql_skips_the_past():
    """docs/consumers.md, 'Adding a consumer to a running system'."""
    placed("old", "older")
    with connect() as late:  # a publisher in flight when the consumer starts: not the past
        late.execute("BEGIN")
        _, in_flight = raw_publish(late, A, "order.placed", {"sku": "in flight"})
        with connect("worker") as conn:  # as the worker role: the app role may not
            conn.execute(
                "INSERT INTO consumer_offsets (name, partition, partition_count, last_id, held)"
                " SELECT 'orders', p, 1, now.last_id, now.held"
                "   FROM outbox_position_now_v2() AS now, generate_series(0, 0) AS p"
            )
        late.execute("COMMIT")
    new = placed("new")
    drain(OrderRecorder(), until=lambda: len(effects()) == 2)
    assert effects() == {str(in_flight): 1, str(new[0]): 1}


@pytest.mark.variants
def test_the_documented_partition_change_starts_every_new_partition_at_the_lowest_position():
    """docs/consumers.md, 'Changing the number of partitions'."""
    keys = [f"k{i}" for i in range(6)]
    publish_many(A, "order.sequenced", [{"sku": k, "seq": 0} for k in keys],
                 key=lambda p: p["sku"])
    drain(PartitionedRecorder(), until=lambda: len(effects()) == 6)
    with observer() as conn:
        conn.execute("UPDATE consumer_offsets SET held = jsonb_build_object(%s::text, last_id - 2)"
                     " WHERE name = 'orders-partitioned' AND partition = 1", [B])
        low = conn.execute("SELECT min(last_id) - 2 FROM consumer_offsets"
                           " WHERE name = 'orders-partitioned' AND partition = 1").fetchone()[0]
    # As the owner, as the page says (the worker role may not delete offset rows).
    with connect("owner", autocommit=True) as owner:
        owner.execute(documented_sql("consumers.md", "### Changing the number of partitions")
                      .replace("'shipping'", "'orders-partitioned'"))
    with observer() as conn:
        rows = conn.execute("SELECT partition_count, last_id FROM consumer_offsets"
                            " WHERE name = 'orders-partitioned'").fetchall()
    assert rows == [(8, low)] * 8



def test_a_consumers_batch_attempts_backoff_and_watch_are_its_attributes(monkeypatch):
    """The defaults docs/consumers.md states, and a bad value refused by name."""
    from outbox.consumers import Consumer, validate

    assert (Consumer.batch_size, Consumer.max_attempts, Consumer.retry_backoff,
            Consumer.retry_backoff_max, Consumer.lost_after,
            Consumer.max_rate) == (500, 5, 1.0, 300.0, 3.0, None)
    for attribute, value in [("batch_size", 0), ("max_attempts", True), ("retry_backoff", -1),
                             ("lost_after", "3s"), ("max_rate", 0), ("max_rate", float("inf"))]:
        monkeypatch.setattr(OrderRecorder, attribute, value)
        with pytest.raises(ConsumerConfigError, match=f"orders: {attribute} must be"):
            validate(OrderRecorder())
        monkeypatch.undo()


def test_a_paced_consumer_keeps_to_its_max_rate_and_its_process_other_consumers_do_not_wait():
    """docs/consumers.md: ``max_rate`` spaces a partition's batches; the other consumers of
    the process run meanwhile."""
    from outbox.consumers import Consumer, run_consumers

    handled: dict[str, list[float]] = {"paced": [], "quick": []}

    class Paced(Consumer):
        name = "paced"
        topics = ["order.paced"]
        batch_size = 10
        max_rate = 20  # a batch of 10 every 0.5 s

        def handle(self, message):
            handled["paced"].append(time.monotonic())

    class Quick(Consumer):
        name = "quick"
        topics = ["order.placed"]
        batch_size = 10

        def handle(self, message):
            handled["quick"].append(time.monotonic())

    publish_many(A, "order.paced", [{"sku": f"p{n}"} for n in range(40)])
    placed(*(f"q{n}" for n in range(40)))
    assert run_consumers([Paced(), Quick()], once=True) == 80
    paced, quick = handled["paced"], handled["quick"]
    assert len(paced) == len(quick) == 40
    # Four batches, each 0.5 s after the one before: 1.5 s from the first to the last
    # (less the first batch's read, a few ms); unpaced, all of it takes a few ms.
    assert paced[-1] - paced[0] > 1.4
    # The other consumer did not wait for the paced one's second batch.
    assert quick[-1] < paced[0] + 0.5
