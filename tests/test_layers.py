"""Each app stands on the floor below it: the outbox works without the idempotency app.

The import contract (``[tool.importlinter]`` in pyproject.toml, run by ``make
lint``) keeps the layers in the source; this test runs them: a project whose
``INSTALLED_APPS`` has ``tenancy`` and ``outbox`` and no ``idempotency``
migrates its own database as the owner, passes ``manage.py check`` on every
alias, publishes as a tenant, relays and consumes, each in a process of its
own, and none of those processes can import ``idempotency`` (the settings
module makes every ``import idempotency`` fail).
"""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from django.conf import settings

from tests.dbsetup import owner_dsn
from tests.live import ROOT

ALONE = "tests.settings_outbox_alone"
NAME = os.environ.get("DIO_TEST_DB", "dio_test") + "_outbox_alone"


def run(*args: str) -> str:
    """``python -m django ARGS`` (or ``-c``) with the outbox-alone settings; its output."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": ALONE, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def manage(*args: str) -> str:
    return run("-m", "django", *args)


@pytest.fixture
def database():
    with psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{NAME}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{NAME}"')
    try:
        yield
    finally:
        with psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{NAME}" WITH (FORCE)')


def rows(sql: str) -> list[tuple]:
    """As the system role (it sees every tenant's rows; the owner is bound by FORCE RLS)."""
    system = settings.DATABASES[settings.TENANCY["SYSTEM_DATABASE"]]
    with psycopg.connect(host=system["HOST"], port=system["PORT"], user=system["USER"],
                         password=system["PASSWORD"], dbname=NAME) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.direct_sessions(reason="the subprocesses connect to a database of their own, "
                             "which the test's pgbouncer does not know")
def test_the_outbox_works_installed_without_the_idempotency_app(database):
    assert "idempotency" in settings.INSTALLED_APPS  # the suite's own settings have it
    manage("migrate", "--database", "owner", "--verbosity", "0")
    assert rows("SELECT count(*) FROM django_migrations WHERE app = 'idempotency'") == [(0,)]
    assert rows("SELECT to_regclass('idempotency_keys') IS NULL") == [(True,)]

    checked = manage("check", "--database", "default", "--database", "worker",
                     "--database", "system", "--fail-level", "WARNING")
    # Nothing but advice (outbox.I130: the optional pg_read_all_stats).
    assert "ERRORS:" not in checked and "WARNINGS:" not in checked, checked

    placed = run("-c", "import django; django.setup(); "
                 "from tests.outbox_alone import place; place(7)")
    assert "published " in placed
    imported = placed.split("imported:", 1)[1].split()
    assert "outbox.publishing" in imported
    assert not [m for m in imported if m.split(".")[0] == "idempotency"], imported

    relayed = manage("relay_outbox", "--once")
    assert "topic=order.placed" in relayed and "tenant=7" in relayed, relayed
    manage("run_consumers", "--once")
    assert rows("SELECT tenant_id, topic FROM outbox_messages ORDER BY id") == [
        (7, "order.placed"), (7, "order.seen")]
    assert rows("SELECT name, last_id > 0 FROM consumer_offsets ORDER BY name") == [
        ("echo", True), ("relay:default", True)]
