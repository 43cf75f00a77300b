"""Helpers for the outbox tests: publishing from raw connections, counting effects,
running the library's processes as real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psycopg
import redis
from django.conf import settings as django_settings

from outbox import publish
from outbox.consumers import Consumer, ensure_offsets, run_batch
from tenancy import tenant_context
from tests.helpers import PATIENCE, app_atomic, observer, set_tenant, wait_for

ROOT = Path(__file__).resolve().parents[3]



def publish_as(tenant_id: int, topic: str, payload: dict[str, Any], **kwargs: Any) -> uuid.UUID:
    """Publish one message in its own transaction, as the app would."""
    with tenant_context(tenant_id), app_atomic():
        return publish(topic, payload, **kwargs)


def publish_many(tenant_id: int, topic: str, payloads: Iterable[dict[str, Any]],
                 key: Callable[[dict[str, Any]], str | None] = lambda p: None) -> list[uuid.UUID]:
    """Publish several messages in one transaction."""
    with tenant_context(tenant_id):
        return [publish(topic, p, key=key(p)) for p in payloads]


def raw_publish(conn: psycopg.Connection, tenant_id: int, topic: str,
                payload: dict[str, Any], key: str | None = None) -> tuple[int, uuid.UUID]:
    """INSERT a message on a raw app-role connection, in its open transaction.

    The same row publish() writes; used where two transactions must be open at
    once (Django has one connection per thread).
    """
    message_id = uuid.uuid4()
    set_tenant(conn, tenant_id)
    row = conn.execute(
        "INSERT INTO outbox_messages (tenant_id, message_id, topic, key, payload)"
        " VALUES (%s, %s, %s, %s, %s::jsonb) RETURNING id",
        [tenant_id, message_id, topic, key, json.dumps(payload)],
    ).fetchone()
    return row[0], message_id


def effects() -> Counter[str]:
    """Order rows per note (the message id the handler wrote), across tenants."""
    with observer() as conn:
        return Counter(n for (n,) in conn.execute("SELECT note FROM testapp_order"))


def orders_by_key() -> dict[str, list[int]]:
    """Per sku, the quantities (sequence numbers) in the order they were inserted."""
    with observer() as conn:
        rows = conn.execute("SELECT sku, quantity FROM testapp_order ORDER BY id").fetchall()
    result: dict[str, list[int]] = {}
    for sku, seq in rows:
        result.setdefault(sku, []).append(seq)
    return result


def drain(consumer: Consumer, until: Callable[[], bool] = lambda: True) -> int:
    """Run batches over every partition until ``until()`` holds and a round is idle."""
    ensure_offsets(consumer)
    handled = 0
    deadline = time.monotonic() + PATIENCE
    while True:
        results = [run_batch(consumer, p) for p in range(consumer.partitions)]
        handled += sum(r.handled for r in results)
        busy = any(r.handled or r.failed or r.full for r in results)
        if not busy and until():
            return handled
        if time.monotonic() > deadline:
            raise AssertionError(f"{consumer.name} did not catch up")
        if not busy:
            time.sleep(0.05)


def offset(name: str, partition: int = 0) -> tuple[int, int]:
    """(the id up to which a reader has passed everything, attempts), as the observer sees it.

    The position's floor: its last id, or a held tenant's position below it
    (a reader that went past a publisher in flight: outbox.stream.Position).
    """
    with observer() as conn:
        row = conn.execute(
            "SELECT least(last_id, (SELECT min(h.upto::bigint)"
            "                         FROM jsonb_each_text(held) AS h(tenant, upto))),"
            "       attempts"
            "  FROM consumer_offsets WHERE name = %s AND partition = %s",
            [name, partition],
        ).fetchone()
    return row


def message_position(message_id: uuid.UUID) -> int:
    """A message's position in the stream: its id."""
    with observer() as conn:
        return conn.execute(
            "SELECT id FROM outbox_messages WHERE message_id = %s", [message_id]
        ).fetchone()[0]


class Process:
    """A manage.py (or celery) subprocess, its output in a file."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._file = open(log, "wb")  # noqa: SIM115
        self.popen = subprocess.Popen(
            args, cwd=ROOT, stdout=self._file, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    @classmethod
    def manage(cls, *args: str, log: Path, env: dict[str, str] | None = None) -> Process:
        return cls([sys.executable, "manage.py", *args], log, env)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_output(self, text: str) -> None:
        wait_for(lambda: text in self.output or self.popen.poll() is not None,
                 f"{text!r} in {self.log.name}")
        assert text in self.output, self.output[-3000:]

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def stop(self, timeout: float = PATIENCE) -> int:
        """SIGTERM, and the exit status."""
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self._file.close()


def terminate_backends(application_name: str) -> int:
    """Cut every session of one process, as a server restart would (direct sessions only)."""
    with observer() as conn:
        return len(conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            [application_name],
        ).fetchall())


def pooled(*aliases: str) -> bool:
    """Whether ``DIO_POOLED`` puts one of ``aliases`` behind pgbouncer."""
    return bool(set(aliases) & set(getattr(django_settings, "POOLED_ALIASES", ())))


class LoopCut:
    """Cuts the database connections of a loop process the test starts, as a restart would.

    Directly, its sessions are terminated on the server, found by the
    ``application_name`` the process is given (``env``). Behind pgbouncer
    (``DIO_POOLED`` pools the worker alias, where a batch or a relay's lease
    runs), the process connects through a pgbouncer of the test's own
    (``pooler``), which is restarted: its client connections close under it,
    as in a pooler's restart. Never by ``application_name`` there: behind a
    pooler, a session belongs to whichever client borrowed it, and
    docs/scaling.md warns that the next borrower would be cut.
    """

    def __init__(self, pooler: Any = None) -> None:
        self.pooler = pooler
        self.application_name = f"dio-loop-{uuid.uuid4().hex[:6]}"
        self.env = {"PGAPPNAME": self.application_name}
        if pooler is not None:
            self.env["DIO_PGBOUNCER_PORT"] = str(pooler.port)

    def cut(self) -> None:
        if self.pooler is not None:
            self.pooler.restart()
        else:
            assert terminate_backends(self.application_name) > 0, "the loop had no session"


#: Dotted paths of the support modules, for subprocesses and settings.
SUPPORT = "tests.outbox.support"
ORDER_WORKER_APP = SUPPORT + ".order_worker_app"
FAULT_WORKER_APP = SUPPORT + ".fault_worker_app"
FAULT_PROCESS_SETTINGS = SUPPORT + ".fault_process_settings"


def faulty_transport(name: str) -> str:
    """The dotted path of a transport of ``faulty_transports`` (for ``--transport``)."""
    return f"{SUPPORT}.faulty_transports.{name}"


def recorder(name: str) -> str:
    """The dotted path of a consumer of ``recorders`` (for ``OUTBOX["CONSUMERS"]``)."""
    return f"{SUPPORT}.recorders.{name}"


#: The environment of a subprocess that runs the outbox's commands: the
#: outbox overlay (tests/outbox/support/process_settings.py) on this run's own settings module.
SUBPROCESS_SETTINGS = {
    "DJANGO_SETTINGS_MODULE": "tests.outbox.support.process_settings",
    "DIO_BASE_SETTINGS": django_settings.SETTINGS_MODULE,
}


def queue_length(name: str) -> int:
    """How many tasks wait in the Redis list ``name`` on the suite's broker."""
    with redis.Redis.from_url(django_settings.CELERY_BROKER_URL) as client:
        return int(client.llen(name))


def queued_message_ids(name: str) -> Counter[str]:
    """How often each outbox message id is in the suite's Redis list ``name``."""
    from base64 import b64decode

    with redis.Redis.from_url(django_settings.CELERY_BROKER_URL) as client:
        items = client.lrange(name, 0, -1)
    return Counter(json.loads(b64decode(json.loads(i)["body"]))[0][0]["message_id"]
                   for i in items)


class Broker:
    """The broker a parametrised test runs on: the suite's Redis or its RabbitMQ.

    ``env`` is what a subprocess (a worker, a relay) needs to use it; ``app``
    the Celery app the relay in this process sends through (None: the
    settings' own, on Redis).
    """

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self.env = {"DIO_BROKER_URL": url} if name == "rabbitmq" else {}
        self.app: Any = None
        if name == "rabbitmq":
            from tests.outbox.support.order_worker_app import build

            self.app = build(url)

    def __repr__(self) -> str:
        return self.name

    def length(self, queue: str) -> int:
        """Messages waiting in ``queue`` (on RabbitMQ: ready, not delivered to a worker)."""
        if self.name == "rabbitmq":
            from tests.outbox.support.rig import amqp_queue_length

            return amqp_queue_length(self.url, queue)
        with redis.Redis.from_url(self.url) as client:
            return int(client.llen(queue))

    def delete(self, queue: str) -> None:
        if self.name == "rabbitmq":
            from kombu import Connection

            with Connection(self.url) as connection:
                connection.default_channel.queue_delete(queue)
            return
        with redis.Redis.from_url(self.url) as client:
            client.delete(queue)


def amqp_url() -> str | None:
    """The suite's RabbitMQ (scripts/services run ... rabbitmq exports DIO_AMQP_URL)."""
    return os.environ.get("DIO_AMQP_URL") or None
