"""System checks outbox.E001/E002: the fence's two facts in the database."""

from __future__ import annotations

from django.core import checks

from outbox.checks import check_fence
from tests.helpers import observer


def ids(databases=("default", "system")) -> list[str]:
    return [m.id for m in checks.run_checks(databases=list(databases),
                                            tags=[checks.Tags.database])
            if m.id and m.id.startswith("outbox.")]


def test_a_migrated_database_passes():
    assert ids() == []
    assert check_fence(databases=["default", "system"]) == []


def test_a_sequence_that_hands_out_values_out_of_order_is_an_error():
    with observer() as conn:
        for change in ("CACHE 20", "CYCLE", "INCREMENT BY -1"):
            conn.execute(f"ALTER SEQUENCE outbox_message_ids {change}")
            try:
                assert ids(["default"]) == ["outbox.E001"], change
            finally:
                conn.execute("ALTER SEQUENCE outbox_message_ids CACHE 1 NO CYCLE INCREMENT BY 1")
    assert ids() == []


def test_an_id_default_that_skips_the_publisher_lock_is_an_error():
    with observer() as conn:
        conn.execute("ALTER TABLE outbox_messages ALTER COLUMN id"
                     " SET DEFAULT nextval('outbox_message_ids')")
        try:
            [error] = check_fence(databases=["system"])
            assert error.id == "outbox.E002"
            assert "nextval('outbox_message_ids'::regclass)" in error.msg
        finally:
            conn.execute("ALTER TABLE outbox_messages ALTER COLUMN id"
                         " SET DEFAULT outbox_next_id()")
    assert ids() == []
