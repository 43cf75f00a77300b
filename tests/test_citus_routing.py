"""Every statement the library sends to a per-tenant table names its tenant (docs/citus.md).

On Citus, tables distributed by ``tenant_id`` are split into shards; a
statement that pins ``tenant_id`` goes to one shard, one that does not goes
to all. The check (tests/shard_routing.py) reads the statements with
PostgreSQL's own parser: here on examples that must pass and fail, then on
every statement of the query files and every SQL function the migrations
create. A statement that reads across tenants on purpose says so in its
reason (``Across tenants:``), and docs/citus.md says what replaces it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pglast.parser import ParseError

from tenancy.db import tenant_isolated_tables
from tests.shard_routing import (
    ACROSS_TENANTS,
    function_statements,
    query_blocks,
    unrouted,
)

ROOT = Path(__file__).resolve().parents[1]
APPS = ("idempotency", "outbox", "tenancy")

#: The SQL functions that read every tenant's rows on purpose, and why; what
#: replaces each on Citus is on docs/citus.md.
ACROSS_TENANTS_FUNCTIONS = {
    "outbox_read_v2": "the delivery read: one stream of all tenants behind the fence",
}


@pytest.fixture(scope="module")
def tables() -> set[str]:
    found = set(tenant_isolated_tables())
    assert {"idempotency_keys", "outbox_messages", "outbox_received"} <= found
    return found


ROUTED = [
    "SELECT response FROM idempotency_keys WHERE tenant_id = %s AND scope = %s AND key = %s",
    "INSERT INTO outbox_messages (tenant_id, message_id, topic) VALUES (%s, %s, %s)",
    "UPDATE idempotency_keys SET state = 'done' WHERE key = %(key)s AND tenant_id = %(tenant)s",
    "DELETE FROM outbox_received WHERE (tenant_id, receiver, message_id) IN ("
    " SELECT tenant_id, receiver, message_id FROM outbox_received"
    "  WHERE tenant_id = %s AND received_at < now() - interval '1 day' LIMIT %s)",
    "SELECT m.id FROM outbox_messages AS m JOIN outbox_dead_letters AS d"
    " ON d.tenant_id = m.tenant_id AND d.message_id = m.message_id WHERE m.tenant_id = %s",
    "SELECT id FROM outbox_messages WHERE tenant_id = ANY(%s) AND id > %s",
    "SELECT name, last_id FROM consumer_offsets",  # not a per-tenant table
    "SELECT 100 %% 7",
]

UNROUTED = [
    ("SELECT * FROM outbox_messages WHERE id > %s", "SELECT on outbox_messages"),
    ("UPDATE idempotency_keys SET state = 'x' WHERE key = %s", "UPDATE on idempotency_keys"),
    ("DELETE FROM outbox_received WHERE received_at < now()", "DELETE on outbox_received"),
    ("SELECT * FROM outbox_messages WHERE tenant_id = %s OR id > 5", "SELECT on outbox_messages"),
    ("INSERT INTO outbox_messages SELECT * FROM outbox_messages WHERE tenant_id = 1",
     "INSERT INTO outbox_messages without a tenant_id column"),
    ("SELECT * FROM outbox_messages AS m, outbox_received AS r WHERE r.tenant_id = %s",
     "SELECT on outbox_messages AS m"),
    ("SELECT * FROM outbox_messages WHERE tenant_id = 1 AND message_id IN"
     " (SELECT message_id FROM outbox_dead_letters)", "SELECT on outbox_dead_letters"),
    ("WITH recent AS (SELECT * FROM outbox_messages) SELECT * FROM recent WHERE tenant_id = 1",
     "SELECT on outbox_messages"),
    ("SELECT * FROM outbox_messages m JOIN outbox_received r ON r.message_id = m.message_id"
     " WHERE m.tenant_id = %s", "SELECT on outbox_received AS r"),
    ("SELECT id FROM outbox_messages WHERE tenant_id = 1 UNION ALL"
     " (SELECT id FROM outbox_dead_letters ORDER BY id LIMIT 5)", "SELECT on outbox_dead_letters"),
]


@pytest.mark.parametrize("sql", ROUTED)
def test_a_statement_that_pins_its_tenant_passes(sql, tables):
    assert unrouted(sql, tables) == []


@pytest.mark.parametrize("sql, problem", UNROUTED)
def test_a_statement_without_tenant_id_on_a_per_tenant_table_fails(sql, problem, tables):
    assert problem in "; ".join(unrouted(sql, tables))


def test_what_the_parser_cannot_read_is_an_error_not_a_pass(tables):
    with pytest.raises(ParseError):
        unrouted("SELEC * FROM outbox_messages", tables)


def test_a_function_body_is_read_statement_by_statement(tables):
    sql = """
CREATE FUNCTION leak(after bigint) RETURNS SETOF outbox_messages LANGUAGE plpgsql AS $f$
DECLARE n bigint;
BEGIN
    n := (SELECT count(*) FROM outbox_received WHERE tenant_id = 1);
    RETURN QUERY SELECT * FROM outbox_messages WHERE id > after;
END $f$;
CREATE FUNCTION fine(t bigint) RETURNS bigint LANGUAGE sql AS $f$
    SELECT count(*) FROM outbox_messages WHERE tenant_id = t
$f$;
"""
    found = function_statements(sql)
    assert sorted(found) == ["fine", "leak"]
    assert [p for s in found["leak"] for p in unrouted(s, tables)] == [
        "SELECT on outbox_messages without a tenant_id condition"]
    assert [p for s in found["fine"] for p in unrouted(s, tables)] == []


def _query_files() -> list[Path]:
    return [ROOT / app / "queries.sql" for app in APPS if (ROOT / app / "queries.sql").exists()]


def test_every_statement_of_the_query_files_names_its_tenant(tables):
    files = _query_files()
    assert files, "no query file: the statement layer (<app>/queries.sql) is missing"
    problems = []
    for path in files:
        for name, (reason, statement) in query_blocks(path.read_text()).items():
            if ACROSS_TENANTS in reason:
                continue
            problems += [f"{path.parent.name}/queries.sql {name}: {p}"
                         for p in unrouted(statement, tables)]
    assert problems == []


def test_every_function_of_the_migrations_names_its_tenant(tables):
    latest: dict[str, list[str]] = {}
    for app in APPS:
        for path in sorted((ROOT / app / "sql").glob("*.sql")):
            if path.name.endswith(".reverse.sql"):
                continue
            latest.update(function_statements(path.read_text()))
    assert "outbox_read_v2" in latest and "outbox_mark_publisher_v2" in latest
    problems = [f"{name}(): {p}" for name, statements in sorted(latest.items())
                if name not in ACROSS_TENANTS_FUNCTIONS
                for statement in statements for p in unrouted(statement, tables)]
    assert problems == []
