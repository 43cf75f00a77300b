"""Migration 0003: positions move from (xid, id) order to id order, exactly or not at all.

Each test runs ``manage.py migrate`` in a process of its own, as the owner, on
a database of its own migrated to the outbox's 0002 (the release before the
publisher fence), with messages whose (xid, id) order differs from their id
order, as concurrent transactions leave them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import psycopg
import pytest
from django.conf import settings

from tests.dbsetup import owner_dsn
from tests.helpers import superuser
from tests.outbox.support.helpers import ROOT, wait_for

A, B = 1, 2
MAX_ID = 2**63 - 1

#: (id, xid, tenant) in the order the old readers read them, by (xid, id):
#: message 4 took its id after message 3, but its transaction took its xid first.
MESSAGES = [(1, 100, A), (2, 100, B), (4, 101, A), (3, 102, B), (5, 103, A), (6, 103, B)]


def migrate(database: str, target: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "manage.py", "migrate", "--database", "owner", "outbox"]
    return subprocess.run(
        command + ([target] if target else []), cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DIO_TEST_DB": database},
    )


@pytest.fixture
def old_outbox() -> Iterator[str]:
    """A database at the outbox's 0002, holding MESSAGES."""
    name = f"{settings.DATABASES['default']['NAME']}_migration"
    with psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    result = migrate(name, "0002")
    assert result.returncode == 0, result.stderr[-3000:]
    with superuser(name) as conn:
        for id_, xid, tenant in MESSAGES:
            conn.execute(
                "INSERT INTO outbox_messages (id, xid, tenant_id, message_id, topic, payload)"
                " VALUES (%s, %s::text::xid8, %s, gen_random_uuid(), 't', '{}')",
                [id_, xid, tenant],
            )
        conn.execute("SELECT setval(pg_get_serial_sequence('outbox_messages', 'id'), 6)")
    yield name
    with psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def add_reader(database: str, name: str, xid: int, last_id: int, attempts: int = 0,
               lease_owner: str = "") -> None:
    with superuser(database) as conn:
        conn.execute(
            "INSERT INTO consumer_offsets (name, partition, partition_count, last_xid, last_id,"
            " attempts, retry_at, last_error, lease_owner, lease_until)"
            " VALUES (%s, 0, 1, %s::text::xid8, %s, %s, CASE WHEN %s > 0 THEN now() END,"
            " CASE WHEN %s > 0 THEN 'Boom' ELSE '' END, %s,"
            " CASE WHEN %s <> '' THEN now() + interval '30 seconds' END)",
            [name, xid, last_id, attempts, attempts, attempts, lease_owner, lease_owner],
        )


def positions(database: str) -> dict[str, tuple[int, int]]:
    with superuser(database) as conn:
        rows = conn.execute("SELECT name, last_id, attempts FROM consumer_offsets").fetchall()
    return {name: (last_id, attempts) for name, last_id, attempts in rows}


def test_the_migration_refuses_a_position_with_no_equivalent_in_id_order(old_outbox):
    add_reader(old_outbox, "caught-up", 103, 6)
    add_reader(old_outbox, "straddling", 101, 4)  # passed 1, 2 and 4, but not 3
    result = migrate(old_outbox)
    assert result.returncode != 0
    message = [line for line in result.stderr.splitlines() if "outbox: reader" in line]
    assert message, result.stderr[-3000:]
    assert "reader straddling (partition 0) has passed message 4 but not message 3" in message[-1]
    assert "run the relays and consumers of the previous release until they have caught up" \
        in message[-1]
    with superuser(old_outbox) as conn:  # nothing changed: still the release before
        assert conn.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'consumer_offsets' AND column_name = 'last_xid'"
        ).fetchone()[0] == 1
        assert conn.execute("SELECT to_regproc('outbox_fence')").fetchone()[0] is None


def test_the_migration_converts_every_position_exactly(old_outbox):
    add_reader(old_outbox, "caught-up", 103, 6)
    add_reader(old_outbox, "past-the-fence", 103, MAX_ID)  # a quiet reader moved to its fence
    add_reader(old_outbox, "behind", 102, 3)  # passed 1, 2, 4, 3: ids up to 4
    add_reader(old_outbox, "fresh", 0, 0)
    add_reader(old_outbox, "failing-same-head", 102, 3, attempts=3)  # head 5 either way
    add_reader(old_outbox, "failing-other-head", 100, 2, attempts=2)  # head 4, then 3
    add_reader(old_outbox, "relay:default", 103, 6, lease_owner="dead-host:1:x")
    result = migrate(old_outbox)
    assert result.returncode == 0, result.stderr[-3000:]
    assert positions(old_outbox) == {
        "caught-up": (6, 0),
        "past-the-fence": (6, 0),
        "behind": (4, 0),
        "fresh": (0, 0),
        "failing-same-head": (4, 3),
        "failing-other-head": (2, 0),
        "relay:default": (6, 0),
    }
    with superuser(old_outbox) as conn:
        assert conn.execute("SELECT lease_owner, lease_until FROM consumer_offsets"
                            " WHERE name = 'relay:default'").fetchone() == ("", None)
        # the readers go on in id order, from where they were
        rows = conn.execute("SELECT (message).id FROM outbox_read_v2(4, '{}', 10, NULL, 0, 1)"
                            " WHERE (message).id IS NOT NULL").fetchall()
        assert [r[0] for r in rows] == [5, 6]
        conn.execute("BEGIN")
        conn.execute("INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
                     " VALUES (1, gen_random_uuid(), 't', '{}')")
        assert conn.execute("SELECT max(id) FROM outbox_messages").fetchone()[0] == 7
        conn.execute("ROLLBACK")
        # row-level security is forced again on the table
        assert conn.execute("SELECT relforcerowsecurity FROM pg_class"
                            " WHERE relname = 'outbox_messages'").fetchone()[0]


def test_the_migration_waits_for_a_publisher_in_flight(old_outbox):
    """Converted while a message was uncommitted, a caught-up reader would skip it.

    A publisher that starts meanwhile (the previous release's code, the same
    INSERT) waits for the migration, then takes its id from the new default,
    marking itself as a publisher in flight.
    """
    add_reader(old_outbox, "caught-up", 103, 6)
    insert = ("INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
              " VALUES (2, gen_random_uuid(), 't', '{}') RETURNING id")
    with superuser(old_outbox) as publisher, superuser(old_outbox) as latecomer:
        publisher.execute("BEGIN")
        publisher.execute(insert)  # id 7, uncommitted
        results: list[subprocess.CompletedProcess[str]] = []
        migration = threading.Thread(target=lambda: results.append(migrate(old_outbox)))
        migration.start()
        late: list[tuple[int, int]] = []

        def publish_late() -> None:
            latecomer.execute("BEGIN")
            [(id_,)] = latecomer.execute(insert).fetchall()
            [(marks,)] = latecomer.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2"
                " AND classid::bigint >> 16 = 28514 AND pid = pg_backend_pid()").fetchall()
            latecomer.execute("COMMIT")
            late.append((id_, marks))

        later = threading.Thread(target=publish_late)
        try:
            def waiting(count: int) -> bool:
                with superuser(old_outbox) as conn:
                    return conn.execute(
                        "SELECT count(*) FROM pg_locks WHERE NOT granted"
                        " AND relation = 'outbox_messages'::regclass"
                    ).fetchone()[0] >= count

            wait_for(lambda: waiting(1), "the migration to wait for the publisher")
            later.start()
            wait_for(lambda: waiting(2), "the late publisher to wait for the migration")
            publisher.execute("COMMIT")
        finally:
            migration.join()
            if later.ident:
                later.join()
    assert results[0].returncode == 0, results[0].stderr[-3000:]
    assert positions(old_outbox)["caught-up"] == (6, 0)  # message 7 is still to come
    assert late == [(8, 1)]  # from the new sequence, under the publisher's lock


# -- migration 0008: the fence per tenant ----------------------------------------------

OLD_INSERT = ("INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
              " VALUES (%s, gen_random_uuid(), 't', '{}') RETURNING id")


@pytest.fixture
def outbox_at_0007() -> Iterator[str]:
    """A database at the outbox's 0007 (the release before the fence per tenant), with
    three messages published by that release's code and a reader that passed them."""
    name = f"{settings.DATABASES['default']['NAME']}_fence_upgrade"
    with psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    result = migrate(name, "0007")
    assert result.returncode == 0, result.stderr[-3000:]
    with superuser(name) as conn:
        for tenant in (A, B, A):
            conn.execute(OLD_INSERT, [tenant])
        conn.execute("INSERT INTO consumer_offsets (name, partition, partition_count, last_id)"
                     " VALUES ('caught-up', 0, 1, 3)")
    yield name
    with psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def read_v2(database: str, last_id: int, held: str = "{}") -> list[int]:
    with superuser(database) as conn:
        rows = conn.execute("SELECT (message).id FROM outbox_read_v2(%s, %s::jsonb, 10, NULL, 0, 1)"
                            " WHERE (message).id IS NOT NULL", [last_id, held]).fetchall()
    return [row[0] for row in rows]


def test_0008_waits_for_a_publisher_of_the_previous_release_and_skips_nothing(outbox_at_0007):
    """A message of the previous release's code, uncommitted while the migration waits, is
    read by the caught-up reader afterwards; the same code keeps publishing, now marked
    by the trigger; the previous release's readers are refused."""
    with superuser(outbox_at_0007) as publisher:
        publisher.execute("BEGIN")
        [(in_flight,)] = publisher.execute(OLD_INSERT, [B]).fetchall()  # id 4, the old default
        results: list[subprocess.CompletedProcess[str]] = []
        migration = threading.Thread(target=lambda: results.append(migrate(outbox_at_0007)))
        migration.start()
        try:
            def waiting() -> bool:
                with superuser(outbox_at_0007) as conn:
                    return conn.execute(
                        "SELECT count(*) FROM pg_locks WHERE NOT granted"
                        " AND relation = 'outbox_messages'::regclass").fetchone()[0] >= 1

            wait_for(waiting, "the migration to wait for the publisher")
            publisher.execute("COMMIT")
        finally:
            migration.join()
    assert results[0].returncode == 0, results[0].stderr[-3000:]
    assert read_v2(outbox_at_0007, 3) == [in_flight]
    with superuser(outbox_at_0007) as conn:
        conn.execute("BEGIN")
        [(later,)] = conn.execute(OLD_INSERT, [A]).fetchall()  # the previous release's INSERT
        assert later == in_flight + 1
        assert conn.execute("SELECT tenant_id FROM outbox_publishers_v2()").fetchall() == [(A,)]
        conn.execute("COMMIT")
        assert conn.execute("SELECT held FROM consumer_offsets").fetchone()[0] == {}
        for statement in ("SELECT * FROM outbox_read(3, 10, NULL, 0, 1)", "SELECT outbox_fence()"):
            with pytest.raises(psycopg.errors.RaiseException, match="earlier release"):
                conn.execute(statement)
            conn.rollback()


def test_0008_undone_moves_a_held_position_back_to_its_lowest_tenant(outbox_at_0007):
    assert migrate(outbox_at_0007).returncode == 0
    with superuser(outbox_at_0007) as conn:
        conn.execute("UPDATE consumer_offsets SET last_id = 3, held = '{\"2\": 1}'")
    result = migrate(outbox_at_0007, "0007")
    assert result.returncode == 0, result.stderr[-3000:]
    with superuser(outbox_at_0007) as conn:
        assert conn.execute("SELECT last_id FROM consumer_offsets").fetchone()[0] == 1
        assert conn.execute("SELECT (message).id FROM outbox_read(1, 10, NULL, 0, 1)"
                            " WHERE (message).id IS NOT NULL").fetchall() == [(2,), (3,)]
        [(id_,)] = conn.execute(OLD_INSERT, [A]).fetchall()
        assert id_ == 4  # from the default again


# -- migration 0010: the database's marks (time, proofs) ---------------------------------


@pytest.fixture
def outbox_at_0008() -> Iterator[str]:
    """A database at the outbox's 0008, with a message a writer dated in the year 2999."""
    name = f"{settings.DATABASES['default']['NAME']}_marks_upgrade"
    with psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    result = migrate(name, "0008")
    assert result.returncode == 0, result.stderr[-3000:]
    with superuser(name) as conn:
        conn.execute("INSERT INTO outbox_messages (tenant_id, message_id, topic, payload,"
                     " created_at) VALUES (%s, gen_random_uuid(), 't', '{}', '2999-01-01')", [A])
    yield name
    with psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_0010_waits_for_a_publisher_marked_without_proof_and_dates_no_message_in_the_future(
    outbox_at_0008,
):
    """A publisher in flight carries 0008's marks, which 0010's readers would not count:
    the migration waits for it. A message dated in the future is brought back to the
    migration's time; a message written afterwards gets the database's time and proof."""
    with superuser(outbox_at_0008) as publisher:
        publisher.execute("BEGIN")
        [(in_flight,)] = publisher.execute(OLD_INSERT, [B]).fetchall()
        results: list[subprocess.CompletedProcess[str]] = []
        migration = threading.Thread(target=lambda: results.append(migrate(outbox_at_0008)))
        migration.start()
        try:
            def waiting() -> bool:
                with superuser(outbox_at_0008) as conn:
                    return conn.execute(
                        "SELECT count(*) FROM pg_locks WHERE NOT granted"
                        " AND relation = 'outbox_messages'::regclass").fetchone()[0] >= 1

            wait_for(waiting, "the migration to wait for the publisher")
            publisher.execute("COMMIT")
        finally:
            migration.join()
    assert results[0].returncode == 0, results[0].stderr[-3000:]
    assert read_v2(outbox_at_0008, 0) == [1, in_flight]
    with superuser(outbox_at_0008) as conn:
        assert conn.execute("SELECT count(*) FROM outbox_messages WHERE created_at > now()"
                            ).fetchone()[0] == 0
        assert conn.execute("SELECT relforcerowsecurity FROM pg_class"
                            " WHERE oid = 'outbox_messages'::regclass").fetchone()[0]
        conn.execute("BEGIN")
        conn.execute("INSERT INTO outbox_messages (tenant_id, message_id, topic, payload,"
                     " created_at) VALUES (%s, gen_random_uuid(), 't', '{}', '2999-01-01')", [B])
        assert conn.execute("SELECT tenant_id FROM outbox_publishers_v2()").fetchall() == [(B,)]
        assert conn.execute("SELECT created_at = now() FROM outbox_messages"
                            " WHERE created_at > '2100-01-01' OR id = (SELECT max(id) FROM"
                            " outbox_messages)").fetchall() == [(True,)]
        conn.execute("COMMIT")


def test_0010_undone_counts_the_marks_of_0008_again(outbox_at_0008):
    assert migrate(outbox_at_0008).returncode == 0
    result = migrate(outbox_at_0008, "0008")
    assert result.returncode == 0, result.stderr[-3000:]
    with superuser(outbox_at_0008) as conn:
        assert conn.execute("SELECT to_regclass('outbox_fence_key')").fetchone()[0] is None
        conn.execute("BEGIN")
        conn.execute("LOCK TABLE outbox_messages IN ROW EXCLUSIVE MODE")
        conn.execute(f"SELECT pg_advisory_xact_lock_shared({B})")  # 0008 trusted such a mark
        assert conn.execute("SELECT tenant_id FROM outbox_publishers_v2()").fetchall() == [(B,)]
        conn.execute("ROLLBACK")
