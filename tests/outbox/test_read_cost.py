"""What a read costs with tenants held: one scan along the ids, never one per held tenant.

A transaction that publishes for many tenants (a batch job, a consumer batch
whose handlers publish) and stays open holds each of them back; readers go
past and keep each tenant's position (``consumer_offsets.held``). The read
(``outbox_read_v2()``, outbox 0012) skips a tenant still held at its
publisher's bound, and reads the held tenants that may move in the same scan
as everyone else's messages. Counted in buffers (pages read), which do not
depend on the machine's speed: the same read before 0012 scanned the ids
once per held tenant (50 held: 50 times the pages). Finding an open
publisher's tenants (``outbox_publishers_v2()``) is counted in the rows its
plan examines (outbox 0013).
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import superuser

TENANTS = 50  # held by one open transaction
EACH = 40  # messages it writes for each
OTHERS = 20_000  # messages of other tenants around it

INSERT = ("INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
          " SELECT %s + g %% %s, gen_random_uuid(), 'cost.test', '{}'"
          "   FROM generate_series(1, %s) AS g")


def read(conn, after: int, held: dict[int, int]) -> tuple[int, dict[str, int], int]:
    """One read of 1,000 as a reader at ``after`` holding ``held``: allocated, in flight,
    and the buffers it touched."""
    plan = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)"
        " SELECT * FROM outbox_read_v2(%s, %s::jsonb, 1000, NULL, 0, 1)",
        [after, json.dumps({str(t): upto for t, upto in held.items()})]).fetchone()[0][0]
    row = conn.execute("SELECT allocated, in_flight FROM outbox_read_v2(%s, %s::jsonb, 1000,"
                       " NULL, 0, 1) LIMIT 1",
                       [after, json.dumps({str(t): u for t, u in held.items()})]).fetchone()
    node = plan["Plan"]
    return row[0], row[1], node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)


@pytest.fixture
def held_by_an_open_transaction():
    """Committed messages of other tenants, a transaction open for ``TENANTS`` tenants, more
    committed messages after it; a reader that went past them all, holding those tenants."""
    with superuser() as conn, superuser() as job:
        conn.execute(INSERT, [1000, 10, OTHERS])
        job.execute("BEGIN")
        job.execute(INSERT, [1, TENANTS, TENANTS * EACH])
        conn.execute(INSERT, [1000, 10, OTHERS])
        allocated, in_flight, _ = read(conn, 0, {})
        held = {int(t): bound for t, bound in in_flight.items()}
        assert sorted(held) == list(range(1, TENANTS + 1))
        yield conn, job, allocated, held
        job.execute("ROLLBACK")


def test_tenants_held_at_an_open_publishers_bound_are_not_scanned(held_by_an_open_transaction):
    conn, _, allocated, held = held_by_an_open_transaction
    _, _, alone = read(conn, allocated, {})
    _, _, holding = read(conn, allocated, held)
    assert holding <= alone + 10, (holding, alone)


def test_held_tenants_that_may_move_are_read_in_one_scan(held_by_an_open_transaction):
    conn, job, allocated, held = held_by_an_open_transaction
    job.execute("COMMIT")
    job.execute("BEGIN")  # the fixture's ROLLBACK ends this one
    lowest = min(held.values())
    # The same 1,000 rows, read by a reader without held tenants: the batch's own cost.
    _, _, batch = read(conn, lowest, {})
    _, _, holding = read(conn, allocated, held)
    assert holding <= 1.5 * batch + 10, (holding, batch)
    taken = [row[0] for row in conn.execute(
        "SELECT (message).id FROM outbox_read_v2(%s, %s::jsonb, 1000, NULL, 0, 1)",
        [allocated, json.dumps({str(t): u for t, u in held.items()})])]
    first = [row[0] for row in conn.execute(
        "SELECT id FROM outbox_messages WHERE id > %s ORDER BY id LIMIT 1000", [lowest])]
    assert taken == first  # the held tenants' messages, in id order, none left out


def test_the_publishers_in_flight_come_once_a_batch(held_by_an_open_transaction):
    """On the first row only: with 10,000 tenants held they are 200 kB, and a batch that
    carried them on each of its 1,000 rows was 200 MB, sorted on disk and sent."""
    conn, _, allocated, held = held_by_an_open_transaction
    rows = conn.execute(
        "SELECT in_flight FROM outbox_read_v2(0, '{}', 1000, NULL, 0, 1)").fetchall()
    assert len(rows) == 1000
    assert {int(t) for t in rows[0][0]} == set(held)
    assert {row[0] for row in rows[1:]} == {None}


def rows_examined(conn, query: str) -> int:
    """The rows every plan node of ``query`` and of the statements it runs (a function's
    body) examined and dropped, counted by auto_explain: work, whatever the machine's speed."""
    plans: list[dict] = []
    conn.add_notice_handler(lambda notice: plans.append(
        json.loads(notice.message_primary.split("plan:", 1)[1])["Plan"])
        if "plan:" in (notice.message_primary or "") else None)
    for setting in ("log_min_duration = 0", "log_analyze = on", "log_timing = off",
                    "log_nested_statements = on", "log_format = json"):
        conn.execute(f"SET auto_explain.{setting}")
    conn.execute("SET client_min_messages = log")
    conn.execute(query).fetchall()
    conn.execute("SET client_min_messages = notice")

    def dropped(node: dict) -> int:
        own = node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Join Filter", 0)
        return own * node.get("Actual Loops", 1) + sum(dropped(n) for n in node.get("Plans", []))

    return sum(dropped(plan) for plan in plans)


def test_many_held_tenants_are_matched_with_their_proofs_in_one_pass():
    """One open transaction publishing for 2,000 tenants holds 4,000 advisory locks (a mark
    and a proof each); finding its tenants examines each lock a few times (hash and merge
    joins, outbox 0013), not once per mark (nested loops: 2,000 x 4,000)."""
    held = 2000
    with superuser() as conn, superuser() as job:
        job.execute("BEGIN")
        job.execute(INSERT, [1, held, held])
        conn.execute("LOAD 'auto_explain'")
        examined = rows_examined(conn, "SELECT * FROM outbox_publishers_v2()")
        (found,) = conn.execute(
            "SELECT count(DISTINCT tenant_id) FROM outbox_publishers_v2()").fetchone()
        job.execute("ROLLBACK")
    assert found == held
    assert examined < 20 * held, examined
