"""The outbox's SQL files and indexes."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from outbox.models import OutboxMessage
from tests.helpers import app_connection


def test_every_sql_file_is_used_by_exactly_one_migration():
    sql_dir = resources.files("outbox").joinpath("sql")
    files = sorted(p.name for p in sql_dir.iterdir() if p.name.endswith(".sql"))
    migrations = Path(resources.files("outbox").joinpath("migrations")).glob("0*.py")
    uses = [name for m in migrations for name in re.findall(r'"([\w.]+\.sql)"', m.read_text())]
    assert sorted(uses) == files


def test_tenant_id_leads_every_index_but_the_documented_delivery_index():
    with app_connection().cursor() as cursor:
        cursor.execute(
            "SELECT indexrelid::regclass::text, indisunique,"
            " (SELECT attname FROM pg_attribute WHERE attrelid = indrelid AND attnum = indkey[0])"
            " FROM pg_index WHERE indrelid::regclass::text = ANY(%s)",
            [["outbox_messages", "outbox_dead_letters", "outbox_received"]],
        )
        rows = cursor.fetchall()
    exceptions = {name for name, unique, first in rows if first != "tenant_id"}
    assert exceptions == {"outbox_messages_delivery"}
    assert not any(unique for name, unique, _ in rows if name == "outbox_messages_delivery")


def test_the_model_reads_xid8():
    assert OutboxMessage._meta.get_field("xid").db_type(app_connection()) == "xid8"


def test_the_delivery_index_serves_the_id_order():
    with app_connection().cursor() as cursor:
        cursor.execute("SELECT pg_get_indexdef('outbox_messages_delivery'::regclass)")
        definition = cursor.fetchone()[0]
    assert definition.endswith("USING btree (id)"), definition
