"""The query files: every statement the apps send, once, by name, valid against the tables.

django_idempotency_outbox.sqlfiles.queries() reads ``<app>/queries.sql``; the
stores ask it by name. These tests hold the files to their format, each
statement to the tables the migrations made (PostgreSQL plans it, runs
nothing), and each name to being used by the app's code and nothing else.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path

import pytest

from django_idempotency_outbox.sqlfiles import parse_queries, queries
from tests.helpers import observer

ROOT = Path(__file__).resolve().parents[1]
APPS = ("idempotency", "outbox", "tenancy")

#: A value for every parameter any statement takes, of the type it is bound as.
PARAMS = {
    "tenant_id": 1, "scope": "s", "key": "k", "lock_id": 7, "fingerprint": "f" * 64,
    "method": "POST", "path": "/x", "state": "completed", "status_code": 201,
    "response": b"{}", "response_headers": "[]", "ttl": timedelta(hours=1),
    "recovery_point": "started", "request_data": "{}", "phase_state": "{}",
    "lease": timedelta(seconds=30), "token": 1, "after": 0, "limit": 10,
    "name": "relay:x", "owner": "me", "seconds": 1.0, "partition": 0, "partitions": 1,
    "message_id": uuid.uuid4(), "topic": "t", "aggregate_type": None, "aggregate_id": None,
    "payload": "{}", "headers": "{}", "held": "{}", "topics": None, "last_id": 0,
    "attempts": 0, "retry_in": None, "consumer": "c", "message_pk": 1, "error": "e",
    "expected_last_id": 0, "expected_held": "{}", "since": datetime.now(UTC),
    "upto": 0, "position": 0, "older_than": 1.0, "receiver": "r", "everyone": 0,
    "tenants": [], "bounds": [], "count": "1", "timeout_ms": "1000",
    "created_at": datetime.now(UTC), "slot": "s", "passed_before": "1", "holder": "r",
    "roles": ["app"], "database": "d", "schema": "public", "tables": ["idempotency_keys"],
    "privileges": ["SELECT"], "role": "app", "guc": "x.y", "key_id": "k1", "inner": b"i",
    "outer": b"o",
}

#: Where a statement binds a name as another type.
OVERRIDES = {
    "give_up_untouched": {"after": timedelta(hours=1)},
    "verify_token": {"token": "a token"},
}


def statements() -> list[tuple[str, str, str]]:
    return [(app, name, sql) for app in APPS for name, sql in queries(app).items()]


@pytest.mark.parametrize("app, name, sql", statements(), ids=lambda v: str(v)[:40])
def test_every_statement_is_valid_against_the_tables(app, name, sql):
    if sql.startswith("SET "):
        return  # a setting: nothing to plan
    params = {**PARAMS, **OVERRIDES.get(name, {})}
    sql = sql.replace("{table}", "idempotency_keys")  # tenants_with_rows: a library table
    with observer() as conn, conn.transaction():  # the owner: the tables, RLS or not
        conn.cursor().execute("EXPLAIN " + sql, params)


@pytest.mark.parametrize("app", APPS)
def test_each_statement_is_used_by_its_app_and_every_name_used_is_there(app):
    code = "\n".join(
        path.read_text() for folder in (ROOT / app, ROOT / "tenancy")
        for path in folder.rglob("*.py") if "migrations" not in path.parts
    )
    names = set(queries(app))
    used = set(re.findall(r'SQL\["(\w+)"\]', code)) | set(re.findall(r'"(\w+)"', code))
    assert names - used == set(), f"{app}/queries.sql: never used"
    own = "\n".join(path.read_text() for path in (ROOT / app).rglob("*.py"))
    asked = set(re.findall(r'SQL\["(\w+)"\]', own))
    assert asked - names == set(), f"{app} asks for statements its file lacks"


@pytest.mark.parametrize("app", APPS)
def test_each_statement_has_its_reason_and_ships_with_the_package(app):
    text = resources.files(app).joinpath("queries.sql").read_text()
    found = parse_queries(text)
    assert found == dict(queries(app))
    for name in found:
        block = text.split(f"-- name: {name}\n", 1)[1]
        assert block.startswith("-- "), f"{app}: {name} has no reason"


@pytest.mark.parametrize("text, problem", [
    ("SELECT 1;\n-- name: a\n-- why\nSELECT 1", "before the first"),
    ("-- name: a\nSELECT 1", "no reason"),
    ("-- name: a\n-- why\n", "no statement"),
    ("-- name: a\n-- why\nSELECT 1\n-- name: a\n-- why\nSELECT 2", "named twice"),
])
def test_a_malformed_query_file_is_refused_with_the_reason(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_queries(text)
