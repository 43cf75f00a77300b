"""What status, health and the lag gauge count: messages up to 10,000 per range, ids past it.

A check counts the messages a reader has not passed; after a broker outage
that is a million rows, and a probe with a timeout would fail on the count
alone. Past 10,000 in a range the count is the ids handed out in it
(docs/operations.md, "behind"): rolled-back ids count too, so it is an upper
bound, read in the same time whatever the backlog.
"""

from __future__ import annotations

import pytest

from outbox.consumers import ensure_offsets
from outbox.observation import status
from tests.helpers import observer
from tests.outbox.support.recorders import OrderRecorder

INSERT = ("INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
          " SELECT 1, gen_random_uuid(), 'order.placed', '{}' FROM generate_series(1, %s)")


def backlog(committed: int, rolled_back: int) -> None:
    """``committed`` messages, with ``rolled_back`` ids taken and given up among them."""
    with observer() as conn:
        conn.execute(INSERT, [committed // 2])
        with conn.transaction(force_rollback=True):
            conn.execute(INSERT, [rolled_back])
        conn.execute(INSERT, [committed - committed // 2])


@pytest.mark.parametrize("committed, behind", [
    (9_000, 9_000),    # counted: the rolled-back ids are not messages
    (10_500, 10_800),  # past 10,000: the ids handed out since the position
])
def test_a_readers_backlog_is_counted_up_to_ten_thousand_then_read_from_the_ids(
        committed, behind):
    ensure_offsets(OrderRecorder())
    backlog(committed, 300)
    [reader] = [r for r in status().readers if r.name == "orders"]
    assert reader.behind == behind
