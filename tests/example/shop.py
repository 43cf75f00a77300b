"""The example shop, served for real: its own database, the fake gateway, gunicorn.

``running_shop()`` prepares a database of its own (dropped, created and
migrated as the owner role, the roles granted: ``manage.py
prepare_demo_database``), seeds the demo merchants with their API tokens
(``seed_demo``), starts the fake payment gateway and serves
``example_project.wsgi`` with gunicorn through ``tests.live.LiveServer``. The
shop runs as the app role, under row-level security, as in the demo.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import requests

from tests.live import ROOT, LiveServer, free_port

DB = "shop_clients_test"


def shop_environment(db: str, gateway_url: str) -> dict[str, str]:
    host, port = os.environ.get("DIO_PGHOST", "127.0.0.1"), os.environ["DIO_PGPORT"]

    def url(role_variable: str, default: str) -> str:
        role = os.environ.get(role_variable, default)
        return f"postgres://{role}:{role}@{host}:{port}/{db}"

    environment = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": url("DIO_APP_ROLE", "dio_app"),
        "WORKER_DATABASE_URL": url("DIO_WORKER_ROLE", "dio_worker"),
        "SYSTEM_DATABASE_URL": url("DIO_SYSTEM_ROLE", "dio_system"),
        "OWNER_DATABASE_URL": url("DIO_OWNER_ROLE", "dio_owner"),
        "CELERY_BROKER_URL": os.environ.get("DIO_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "GATEWAY_URL": gateway_url,
        "CONN_MAX_AGE": "0",
    }
    environment.pop("DIO_CRASH_FILE", None)
    return environment


@dataclass
class Shop:
    url: str
    tokens: dict[str, str]  # user name -> API token
    db: str
    gateway: str  # the fake payment gateway's URL (POST /control steers it)

    def headers(self, user: str = "alice", key: str | None = None, **extra: str) -> dict[str, str]:
        headers = {"Authorization": f"Token {self.tokens[user]}", **extra}
        if key is not None:
            headers["Idempotency-Key"] = key
        return headers

    def observer(self) -> psycopg.Connection:
        """A superuser connection to the shop's database, for counting only."""
        return psycopg.connect(
            host=os.environ.get("DIO_PGSOCKET") or "127.0.0.1",
            port=os.environ["DIO_PGPORT"],
            user="postgres",
            dbname=self.db,
            autocommit=True,
        )

    def count(self, table: str) -> int:
        with self.observer() as conn:
            return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]

    def written(self) -> dict[str, int]:
        """Rows that requests write: keys, orders, payments, outbox messages."""
        tables = ("idempotency_keys", "shop_order", "shop_payment", "outbox_messages")
        return {table: self.count(table) for table in tables}


class ShopServer(LiveServer):
    """``tests.live.LiveServer`` serving the example shop instead of the test app."""

    def __init__(self, environment: dict[str, str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.args[self.args.index("tests.wsgi:application")] = "example_project.wsgi:application"
        self.environment = environment

    def start(self) -> ShopServer:
        saved = dict(os.environ)
        os.environ.update(self.environment)  # LiveServer starts gunicorn with os.environ
        try:
            super().start()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return self


def _manage(environment: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=environment,
        capture_output=True, text=True, timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


@contextlib.contextmanager
def running_shop(db: str = DB, workers: int = 2, threads: int = 4) -> Iterator[Shop]:
    gateway_port = free_port()
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    environment = shop_environment(db, gateway_url)
    _manage(environment, "prepare_demo_database")
    seed = json.loads(_manage(environment, "seed_demo"))
    gateway = subprocess.Popen(
        [sys.executable, "example_project/gateway.py", str(gateway_port)], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    server = None
    try:
        for _ in range(200):
            try:
                requests.get(gateway_url + "/stats", timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.05)
        server = ShopServer(environment, workers=workers, threads=threads).start()
        yield Shop(server.url, {user: data["token"] for user, data in seed.items()}, db,
                   gateway_url)
    finally:
        if server is not None:
            server.stop()
        gateway.kill()
        gateway.wait()
        with contextlib.suppress(Exception), psycopg.connect(
            host=os.environ.get("DIO_PGSOCKET") or "127.0.0.1", port=os.environ["DIO_PGPORT"],
            user="postgres", dbname="postgres", autocommit=True,
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
