"""What a web process answers after PostgreSQL closed its kept connection.

With persistent connections (``CONN_MAX_AGE``), a PostgreSQL restart or
failover leaves each web thread holding a dead connection. Without
``CONN_HEALTH_CHECKS`` the next request on it fails: one 500 per stale
connection, after which Django opens a new one. With it (the example shop's
default), Django checks the connection before the request's first query and
replaces it. The tests cut the shop's sessions with pg_terminate_backend, which
is what a restart does to them; one gunicorn worker with one thread holds the
single stale connection.
"""

from __future__ import annotations

import contextlib
import json
import os

import psycopg
import pytest
import requests

from tests.example.shop import ShopServer, _manage, shop_environment

DB = "shop_health_test"


def superuser(dbname: str = "postgres") -> psycopg.Connection:
    return psycopg.connect(host=os.environ.get("DIO_PGSOCKET") or "127.0.0.1",
                           port=os.environ["DIO_PGPORT"], user="postgres", dbname=dbname,
                           autocommit=True)


@contextlib.contextmanager
def shop_keeping_connections(health_checks: bool):
    environment = {**shop_environment(DB, "http://127.0.0.1:9"), "CONN_MAX_AGE": "600",
                   "CONN_HEALTH_CHECKS": "1" if health_checks else "0"}
    _manage(environment, "prepare_demo_database")
    token = json.loads(_manage(environment, "seed_demo"))["alice"]["token"]
    server = ShopServer(environment, workers=1, threads=1).start()
    try:
        yield server.url, {"Authorization": f"Token {token}"}
    finally:
        server.stop()
        with superuser() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


def cut_the_shops_sessions() -> int:
    app_role = os.environ.get("DIO_APP_ROLE", "dio_app")
    with superuser() as conn:
        return len(conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND usename = %s", [DB, app_role]).fetchall())


@pytest.mark.parametrize(("health_checks", "first_answer"), [(True, 200), (False, 500)])
def test_after_postgresql_closed_the_kept_connection(health_checks, first_answer):
    with shop_keeping_connections(health_checks) as (url, headers):
        for _ in range(2):  # the connection is opened, then kept
            assert requests.get(url + "/orders/", headers=headers, timeout=30).status_code == 200
        assert cut_the_shops_sessions() == 1
        answers = [requests.get(url + "/orders/", headers=headers, timeout=30)
                   for _ in range(3)]
    assert [a.status_code for a in answers] == [first_answer, 200, 200]
    if first_answer == 500:
        assert answers[0].headers["Content-Type"] == "application/problem+json"
