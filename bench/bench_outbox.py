"""make bench-outbox: the outbox's throughput, latency and memory, on this machine.

    . .run/env && .venv/bin/python bench/bench_outbox.py [--messages 100000] [--backlog 1000000]

Measures, against the private PostgreSQL and Redis of scripts/services:

1. relay throughput into a real Redis-backed Celery broker (CeleryTransport),
   without and with ``OUTBOX["SIGNING_KEYS"]`` (every envelope signed),
   beside a minimal batched relay into a raw Redis list (the baseline: no
   fence, no offset, no Celery format), measured in the same run, with the
   broker's durability as configured (Redis ``appendonly``/``appendfsync``),
   and the broker's own time for the relay's messages (the same Celery
   messages pushed again, pre-built, 1,000 per LPUSH: what no relay can beat);
   and, with ``--brokers redis,rabbitmq`` (the default when ``DIO_AMQP_URL``
   is set, as ``make bench-outbox`` does), the same relay into RabbitMQ with
   publisher confirms (each batch confirmed whole), side by side; then
   publishing: ``outbox.publish()`` against a plain INSERT of the
   same row into a table with the same columns and indexes but no trigger,
   100 per transaction, in interleaved rounds;
2. in-database consumer throughput with a no-op handler (10 tenants interleaved);
3. commit-to-publish latency, p50/p99: messages published one per transaction
   at a steady rate while ``manage.py relay_outbox`` runs in its own process;
   the time runs from the publisher's COMMIT returning to the message being
   in the Redis list;
4. memory (RSS) of the relay and of a consumer working through a backlog;
5. delivery while another transaction stays open for 16 s: 20 messages of
   other tenants published and committed meanwhile, one every 0.75 s, through
   ``manage.py relay_outbox``; the open transaction is an unrelated one (it
   wrote, so it has a transaction id), then one that published for a tenant
   of its own (and 5 more of that tenant's messages commit meanwhile, which
   must wait for it);
6. failover: two ``relay_outbox`` processes share a backlog, the one holding
   the lease is SIGKILLed mid-drain; the time from the kill until every
   message is in Redis, and the duplicates and losses it caused.

Targets (DESIGN.md): relay >= 10,000 messages/s on 2 cores and >= 0.5 x the
baseline, publish >= 0.85 x the plain insert, p50 <= 50 ms;
consumer >= 10,000 messages/s; memory flat as the backlog grows; an unrelated
transaction holds nothing back, and a transaction that published holds back
no other tenant (all 20 delivered while it is open, each within about the
p99 latency); a dead relay is replaced within about a second (drain after
SIGKILL <= 2 s, nothing lost).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # run from the project root, not from bench/
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.outbox_settings"

import django  # noqa: E402

django.setup()

import psycopg  # noqa: E402
import redis  # noqa: E402
from amqp import Message  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections, transaction  # noqa: E402
from django.test import override_settings  # noqa: E402
from kombu import Connection  # noqa: E402

from outbox import publish  # noqa: E402
from outbox.consumers import ensure_offsets, run_batch  # noqa: E402
from outbox.relay import Relay  # noqa: E402
from tenancy import tenant_context  # noqa: E402
from tests.helpers import observer  # noqa: E402

QUEUE = settings.OUTBOX["CELERY_QUEUE"]
TENANTS = 10


def log(text: str) -> None:
    print(text, flush=True)


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def setup_database() -> None:
    db = settings.DATABASES["owner"]
    name = settings.DATABASES["default"]["NAME"]
    dsn = f"host={db['HOST']} port={db['PORT']} user={db['USER']} password={db['PASSWORD']}"
    with psycopg.connect(dsn + " dbname=postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", database="owner", verbosity=0)  # grants, as the owner
    connections["owner"].close()


def reset() -> None:
    with observer() as conn:
        conn.execute("TRUNCATE outbox_messages, consumer_offsets RESTART IDENTITY")
        conn.execute("VACUUM ANALYZE outbox_messages")
    broker().delete(QUEUE)


def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def amqp_url() -> str:
    url = os.environ.get("DIO_AMQP_URL", "")
    if not url:
        sys.exit("bench: --brokers rabbitmq needs DIO_AMQP_URL (make bench-outbox starts "
                 "RabbitMQ: scripts/services run pg redis rabbitmq)")
    return url


def amqp_app() -> Any:
    """The bench's Celery app on RabbitMQ, with publisher confirms (the outbox requires them)."""
    from celery import Celery

    app = Celery("dio_bench_amqp", broker=amqp_url(), set_as_current=False)
    app.conf.broker_transport_options = {"confirm_publish": True}
    return app


def queued(on: str) -> int:
    """Messages in the bench's queue on ``on`` (redis or rabbitmq)."""
    if on == "redis":
        return int(broker().llen(QUEUE))
    from amqp.exceptions import NotFound

    with Connection(amqp_url()) as connection:
        try:
            return int(connection.default_channel.queue_declare(QUEUE, passive=True)
                       .message_count)
        except NotFound:
            return 0


def empty(on: str) -> None:
    if on == "redis":
        broker().delete(QUEUE)
        return
    from amqp.exceptions import NotFound

    # Purged, not deleted: Celery's producers remember the queues they declared.
    with Connection(amqp_url()) as connection:
        try:
            connection.default_channel.queue_purge(QUEUE)
        except NotFound:
            pass


def backlog(count: int, chunk: int = 50_000) -> None:
    """Insert ``count`` messages, ``chunk`` per transaction, tenants interleaved."""
    with observer() as conn:
        for start in range(0, count, chunk):
            n = min(chunk, count - start)
            conn.execute(
                "INSERT INTO outbox_messages (tenant_id, message_id, topic, key, payload)"
                " SELECT (g %% %s) + 1, gen_random_uuid(), 'bench.noop', 'order:' || (g %% 5000),"
                "        jsonb_build_object('n', g, 'sku', 'sku-' || g, 'quantity', 1)"
                "   FROM generate_series(%s::bigint, %s::bigint) AS g",
                [TENANTS, start, start + n - 1],
            )
        conn.execute("VACUUM ANALYZE outbox_messages")
    wait_for_fence()


def wait_for_fence(timeout: float = 60.0) -> None:
    """Wait until every inserted message is readable (no publisher in flight).

    A timed run must not start before the backlog is readable. (Written for
    each release's fence, so that this script also measures the releases
    before the fence per tenant.)
    """
    deadline = time.monotonic() + timeout
    with observer() as conn:
        if conn.execute("SELECT to_regproc('outbox_publishers_v2') IS NOT NULL").fetchone()[0]:
            query = "SELECT EXISTS (SELECT 1 FROM outbox_publishers_v2())"
        elif conn.execute("SELECT to_regproc('outbox_fence') IS NOT NULL").fetchone()[0]:
            query = "SELECT coalesce(max(id), 0) >= outbox_fence() FROM outbox_messages"
        else:
            query = ("SELECT coalesce(max(xid), '0'::xid8)"
                     " >= pg_snapshot_xmin(pg_current_snapshot()) FROM outbox_messages")
        while time.monotonic() < deadline:
            if not conn.execute(query).fetchone()[0]:
                return
            time.sleep(0.05)
    sys.exit("bench: something holds the outbox fence back")


def start_relay(name: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    """``manage.py relay_outbox`` in a process of its own (its output to ``log``)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.outbox_settings"}
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, "manage.py", "relay_outbox", "--name", name],
        cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
    )


def message_id_of(item: bytes) -> str:
    """The outbox message id of a Celery message taken from the Redis list."""
    body = json.loads(base64.b64decode(json.loads(item)["body"]))
    return str(body[0][0]["message_id"])


class Arrivals(threading.Thread):
    """Takes every message off the Redis list, noting when each message id arrived."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.times: dict[str, list[float]] = {}
        self.done = threading.Event()

    def run(self) -> None:
        client = broker()
        while not self.done.is_set():
            items = client.rpop(QUEUE, 1000)
            now = time.perf_counter()
            if not items:
                time.sleep(0.002)
                continue
            for item in items:
                self.times.setdefault(message_id_of(item), []).append(now)

    @property
    def received(self) -> int:
        return sum(len(t) for t in list(self.times.values()))

    def stop(self) -> None:
        self.done.set()
        self.join(10)


def bench_relay(count: int, *, signed: bool = False, on: str = "redis") -> tuple[float, float]:
    """Messages/s, and the relay's own CPU time per message in µs (steadier on a busy machine)."""
    keys = ["bench-signing-key-of-at-least-32-bytes-0123456789"] if signed else []
    outbox = {**settings.OUTBOX, "SIGNING_KEYS": keys}
    if on == "rabbitmq":
        outbox["CELERY_APP"] = amqp_app()
    with override_settings(OUTBOX=outbox):
        reset()
        empty(on)
        backlog(count)
        relay = Relay(name="bench-throughput")
        relay.drain()  # warm-up: connections, imports (also moves everything)
        relay.release()
        reset()
        empty(on)
        backlog(count)
        started, cpu = time.perf_counter(), time.process_time()
        sent = relay.drain()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        relay.release()
        relay.transport.close()
        assert sent == count, (sent, count)
        assert queued(on) == count, (queued(on), count)
        if signed:
            assert b'"signature" : "v1.' in base64.b64decode(
                json.loads(broker().lindex(QUEUE, 0))["body"])
        empty(on)
    return count / elapsed, cpu / count * 1e6


def bench_baseline(count: int) -> float:
    """The baseline: a minimal batched relay that reads by id and pushes raw payloads.

    One superuser connection, no tenant, no fence, no offset row, no Celery
    format: the least work that moves a backlog from the table into a Redis
    list, 1,000 rows per round trip. It skips a message that commits late
    and, having no offset, would send everything again after a restart; it
    is here to put a number on what the relay's guarantees cost.
    """
    reset()
    backlog(count)
    client = broker()
    queue = QUEUE + ".baseline"
    client.delete(queue)
    started = time.perf_counter()
    last, sent = 0, 0
    with observer() as conn:
        while True:
            rows = conn.execute(
                "SELECT id, payload::text FROM outbox_messages WHERE id > %s ORDER BY id"
                " LIMIT 1000", [last],
            ).fetchall()
            if not rows:
                break
            client.lpush(queue, *(payload for _, payload in rows))
            last, sent = rows[-1][0], sent + len(rows)
    elapsed = time.perf_counter() - started
    assert sent == count and client.llen(queue) == count, (sent, count)
    client.delete(queue)
    return count / elapsed


def broker_durability() -> str:
    """How the Redis broker keeps what it is given (its append-only file, and its fsync)."""
    client = broker()
    config = {**client.config_get("appendonly"), **client.config_get("appendfsync")}
    return f"appendonly {config.get('appendonly')}, appendfsync {config.get('appendfsync')}"


def bench_broker_floor(count: int, on: str = "redis") -> float:
    """Messages/s of the broker alone taking the relay's own Celery messages.

    The relay's messages are taken from a drained backlog and given to the
    broker again as they were written, with nothing built, read or advanced:
    no relay in Celery's format can go faster than this on the same broker.
    Redis takes them 1,000 per LPUSH; RabbitMQ 1,000 publishes, then their
    confirms, as the relay awaits a batch's.
    """
    reset()
    empty(on)
    backlog(count)
    with override_settings(OUTBOX={**settings.OUTBOX, **(
            {"CELERY_APP": amqp_app()} if on == "rabbitmq" else {})}):
        relay = Relay(name="bench-floor")
        relay.drain()
        relay.release()
        relay.transport.close()
    if on == "redis":
        client = broker()
        items = client.lrange(QUEUE, 0, -1)
        client.delete(QUEUE)
        started = time.perf_counter()
        for start in range(0, len(items), 1000):
            client.lpush(QUEUE, *items[start:start + 1000])
        elapsed = time.perf_counter() - started
        client.delete(QUEUE)
        return len(items) / elapsed
    with Connection(amqp_url()) as connection:
        channel = connection.default_channel
        taken = []
        while (message := channel.basic_get(QUEUE, no_ack=True)) is not None:
            taken.append((message.body, message.properties))
        acked = [0]
        channel.confirm_select()
        channel.events["basic_ack"].add(lambda tag, multiple: acked.__setitem__(0, tag))
        started = time.perf_counter()
        for start in range(0, len(taken), 1000):
            for body, properties in taken[start:start + 1000]:
                channel.basic_publish(Message(body, **properties), exchange="",
                                      routing_key=QUEUE, mandatory=True)
            while acked[0] < min(start + 1000, len(taken)):
                connection.drain_events(timeout=30)
        elapsed = time.perf_counter() - started
    assert len(taken) == count and queued(on) == count, (len(taken), queued(on), count)
    empty(on)
    return len(taken) / elapsed


#: A table like outbox_messages (columns, defaults, constraints, indexes; the
#: same row-level security policy), but without the trigger that marks
#: publishers and gives ids: an identity column gives them.
PLAIN_TABLE = "bench_plain_outbox"


def create_plain_table() -> None:
    with observer() as conn:
        conn.execute(f"DROP TABLE IF EXISTS {PLAIN_TABLE}")
        conn.execute(f"CREATE TABLE {PLAIN_TABLE} (LIKE outbox_messages INCLUDING ALL)")
        conn.execute(f"ALTER TABLE {PLAIN_TABLE} ALTER COLUMN id ADD GENERATED BY DEFAULT AS"
                     " IDENTITY")
        conn.execute(f"ALTER TABLE {PLAIN_TABLE} ENABLE ROW LEVEL SECURITY,"
                     " FORCE ROW LEVEL SECURITY")
        (policy,) = conn.execute(
            "SELECT pg_get_expr(polqual, polrelid) FROM pg_policy"
            " WHERE polrelid = 'outbox_messages'::regclass AND polcmd = '*' LIMIT 1"
        ).fetchone()
        conn.execute(f"CREATE POLICY isolation ON {PLAIN_TABLE} USING ({policy})"
                     f" WITH CHECK ({policy})")
        conn.execute(f"GRANT SELECT, INSERT ON {PLAIN_TABLE} TO "
                     f"{settings.DATABASES['default']['USER']}")


def bench_publish(rounds: int, transactions: int, per: int = 100) -> dict[str, list[float]]:
    """publish() against a plain INSERT of the same row, ``per`` messages per transaction.

    The plain INSERT is the statement publish() sends, into the table without
    the trigger, through one Django cursor per transaction, with the payload
    encoded by ``json.dumps``: what an application writing the row itself
    would do, at its cheapest. Interleaved rounds (their order alternates);
    per round: messages/s, and CPU µs per message of this process and of
    PostgreSQL (every process of the cluster).
    """
    from django.db import connections

    from bench.bench_idempotency import children, cpu_seconds, postmaster_pid

    create_plain_table()
    # outbox_publish()'s INSERT (outbox/sql/0009_publish_function.sql), sent as it is.
    plain_sql = (f"INSERT INTO {PLAIN_TABLE} (tenant_id, message_id, topic, key, aggregate_type,"
                 " aggregate_id, payload, headers) VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb,"
                 " %s::jsonb)")
    tenant = TENANTS + 2

    def with_publish() -> None:
        with tenant_context(tenant), transaction.atomic():
            for n in range(per):
                publish("bench.publish", {"n": n, "sku": "tea"}, key=f"order:{n}")

    def plain() -> None:
        with tenant_context(tenant), transaction.atomic(), connections["default"].cursor() as c:
            for n in range(per):
                c.execute(plain_sql, [tenant, uuid.uuid4(), "bench.publish", f"order:{n}", None,
                                      None, json.dumps({"n": n, "sku": "tea"}), json.dumps({})])

    postmaster = postmaster_pid()
    results: dict[str, list[float]] = {}
    kinds = [("publish", with_publish), ("plain", plain)]
    for r in range(rounds):
        for name, run in kinds if r % 2 == 0 else reversed(kinds):
            run()  # connections open, statements planned
            cluster = [postmaster, *children(postmaster)] if postmaster else []
            started, own, db = time.perf_counter(), time.process_time(), cpu_seconds(cluster)
            for _ in range(transactions):
                run()
            count = transactions * per
            results.setdefault(f"{name} rate", []).append(count / (time.perf_counter() - started))
            results.setdefault(f"{name} cpu", []).append((time.process_time() - own) / count * 1e6)
            results.setdefault(f"{name} db", []).append((cpu_seconds(cluster) - db) / count * 1e6)
    with observer() as conn:
        conn.execute(f"DROP TABLE {PLAIN_TABLE}")
        conn.execute("DELETE FROM outbox_messages WHERE tenant_id = %s", [tenant])
    return results


def bench_consumer(count: int) -> float:
    from bench.outbox_app import Noop

    reset()
    backlog(count)
    consumer = Noop()
    ensure_offsets(consumer)
    started = time.perf_counter()
    handled = 0
    while handled < count:
        handled += run_batch(consumer).handled
    elapsed = time.perf_counter() - started
    return count / elapsed


def bench_latency(count: int, rate: float) -> tuple[float, float, float]:
    reset()
    relay = start_relay("bench-latency")
    committed: dict[str, float] = {}
    arrived: dict[str, float] = {}
    done = threading.Event()

    def read() -> None:
        client = broker()
        while not done.is_set() or len(arrived) < count:
            item = client.brpop([QUEUE], timeout=1)
            if item is None:
                if done.is_set() and len(arrived) >= len(committed):
                    return
                continue
            now = time.perf_counter()
            body = json.loads(base64.b64decode(json.loads(item[1])["body"]))
            arrived[body[0][0]["message_id"]] = now

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(3)  # the relay process starts
    interval = 1.0 / rate
    next_at = time.perf_counter()
    for n in range(count):
        with tenant_context(n % TENANTS + 1), transaction.atomic():
            message_id = publish("bench.latency", {"n": n}, key=f"order:{n}")
        committed[str(message_id)] = time.perf_counter()
        next_at += interval
        pause = next_at - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    done.set()
    reader.join(60)
    relay.terminate()
    relay.wait(30)
    latencies = sorted((arrived[m] - t) * 1000 for m, t in committed.items() if m in arrived)
    assert len(latencies) == count, (len(latencies), count)
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    return statistics.median(latencies), p99, latencies[-1]


def bench_memory(count: int) -> dict[str, list[tuple[int, float]]]:
    from bench.outbox_app import Noop

    reset()
    backlog(count)
    samples: dict[str, list[tuple[int, float]]] = {"relay": [], "consumer": []}
    relay = Relay(name="bench-memory")
    client = broker()
    sent = 0
    every = max(count // 10, 1)
    mark = 0
    while True:
        relay.step()
        if relay.sent == sent:
            break
        sent = relay.sent
        if sent >= mark:
            samples["relay"].append((sent, rss_mb()))
            mark += every
            client.delete(QUEUE)
    client.delete(QUEUE)
    samples["relay"].append((sent, rss_mb()))
    consumer = Noop()
    ensure_offsets(consumer)
    handled, mark = 0, 0
    while handled < count:
        handled += run_batch(consumer).handled
        if handled >= mark:
            samples["consumer"].append((handled, rss_mb()))
            mark += every
    samples["consumer"].append((handled, rss_mb()))
    return samples


def publish_one(n: int, topic: str) -> tuple[str, float]:
    """Publish one message in its own transaction; its id and when COMMIT returned."""
    with tenant_context(n % TENANTS + 1), transaction.atomic():
        message_id = publish(topic, {"n": n}, key=f"order:{n}")
    return str(message_id), time.perf_counter()


def bench_open_transaction(count: int, hold: float, *, publishing: bool) -> dict[str, float]:
    """Messages of other tenants delivered while another transaction stays open.

    ``publishing``: the open transaction published for a tenant of its own
    (``TENANTS + 1``), and 5 more messages of that tenant commit while it is
    open: they must wait for it, and arrive once it ends. Otherwise it is an
    unrelated transaction that wrote (so it has a transaction id).
    """
    reset()
    relay = start_relay("bench-stall")
    arrivals = Arrivals()
    arrivals.start()
    try:
        warm, _ = publish_one(-1, "bench.warm-up")  # the relay process is up and relaying
        deadline = time.monotonic() + 60
        while warm not in arrivals.times and time.monotonic() < deadline:
            time.sleep(0.01)
        own_tenant = TENANTS + 1
        own: list[str] = []
        with observer() as other:
            other.execute("BEGIN")
            if publishing:
                other.execute("SELECT set_config('app.tenant_id', %s, true)", [str(own_tenant)])
                other.execute("INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
                              " VALUES (%s, gen_random_uuid(), 'bench.open', '{}')",
                              [own_tenant])
            else:
                other.execute("CREATE TEMP TABLE bench_unrelated (n int)")
                other.execute("INSERT INTO bench_unrelated VALUES (1)")  # now it has an xid
            xid = other.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
            opened = time.perf_counter()
            committed: dict[str, float] = {}
            for n in range(count):
                message_id, at = publish_one(n, "bench.unrelated")
                committed[message_id] = at
                if publishing and n % 4 == 0:  # the open transaction's tenant: these must wait
                    with tenant_context(own_tenant), transaction.atomic():
                        own.append(str(publish("bench.held", {"n": n})))
                pause = opened + (n + 1) * hold / (count + 1) - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
            time.sleep(max(0.0, opened + hold - time.perf_counter()))
            in_time = {m: arrivals.times[m][0] for m in committed if m in arrivals.times}
            own_early = [m for m in own if m in arrivals.times]
            other.execute("COMMIT")
            closed = time.perf_counter()
        deadline = time.monotonic() + 120
        while len([m for m in [*committed, *own] if m in arrivals.times]) < count + len(own):
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
    finally:
        relay.terminate()
        relay.wait(30)
        arrivals.stop()
    latencies = sorted((in_time[m] - t) * 1000 for m, t in committed.items() if m in in_time)
    late = [(arrivals.times[m][0] - closed) * 1000 for m in committed
            if m not in in_time and m in arrivals.times]
    return {
        "xid": float(xid),
        "delivered_while_open": len(in_time),
        "delivered_after": len(late),
        "p50_ms": statistics.median(latencies) if latencies else float("nan"),
        "max_ms": latencies[-1] if latencies else float("nan"),
        "held_s": hold,
        "own": len(own),
        "own_early": len(own_early),
        "own_after": len([m for m in own if m in arrivals.times]),
    }


def bench_failover(count: int) -> dict[str, float]:
    """Drain after SIGKILL of the relay holding the lease, a second relay waiting."""
    reset()
    name = "bench-failover"
    logs = [Path(f"/tmp/dio-bench-failover-{i}-{os.getpid()}.log") for i in range(2)]
    arrivals = Arrivals()
    arrivals.start()
    relays: list[subprocess.Popen[bytes]] = []
    with observer() as backlog_conn:
        # The backlog stays unreadable (its transaction is open) until both
        # relays run and one of them holds the lease.
        backlog_conn.execute("BEGIN")
        backlog_conn.execute(
            "INSERT INTO outbox_messages (tenant_id, message_id, topic, key, payload)"
            " SELECT (g %% %s) + 1, gen_random_uuid(), 'bench.failover', 'order:' || (g %% 5000),"
            "        jsonb_build_object('n', g, 'sku', 'sku-' || g, 'quantity', 1)"
            "   FROM generate_series(1, %s) AS g",
            [TENANTS, count],
        )
        ids = {str(r[0]) for r in backlog_conn.execute("SELECT message_id FROM outbox_messages")}
        try:
            relays = [start_relay(name, log) for log in logs]
            deadline = time.monotonic() + 60
            while not all(b"running" in log.read_bytes() for log in logs if log.exists()):
                if time.monotonic() > deadline:
                    sys.exit("bench: the relays did not start")
                time.sleep(0.05)
            owner = ""
            while not owner and time.monotonic() < deadline:
                with observer() as conn:
                    row = conn.execute(
                        "SELECT lease_owner FROM consumer_offsets WHERE name = %s",
                        [f"relay:{name}"],
                    ).fetchone()
                owner = row[0] if row else ""
                time.sleep(0.02)
            backlog_conn.execute("COMMIT")
            pid = int(owner.split(":")[1])
            victim = next(r for r in relays if r.pid == pid)
            while arrivals.received < count // 4:
                time.sleep(0.001)
            victim.send_signal(signal.SIGKILL)
            killed = time.perf_counter()
            victim.wait(30)
            before_kill = arrivals.received
            deadline = time.monotonic() + 120
            while len(ids & arrivals.times.keys()) < len(ids) and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(0.5)  # anything still on its way
        finally:
            for relay in relays:
                if relay.poll() is None:
                    relay.terminate()
                    relay.wait(30)
            arrivals.stop()
            for log in logs:
                log.unlink(missing_ok=True)
    after = [t for times in arrivals.times.values() for t in times if t > killed]
    delivered = ids & arrivals.times.keys()
    last = max(min(arrivals.times[m]) for m in delivered) if delivered else killed
    return {
        "messages": count,
        "before_kill": before_kill,
        "takeover_s": (min(after) - killed) if after else float("nan"),
        "drain_s": last - killed,
        "duplicates": arrivals.received - len(delivered),
        "lost": len(ids - delivered),
    }


def broker_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ("redis", "rabbitmq")]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown broker(s) {', '.join(unknown) or '(none)'}; known: redis, rabbitmq")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--latency-messages", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=200.0, help="published messages/s")
    parser.add_argument("--unrelated-hold", type=float, default=16.0,
                        help="seconds the unrelated transaction stays open")
    parser.add_argument("--failover-messages", type=int, default=10_000)
    parser.add_argument("--brokers", type=broker_list,
                        default="redis,rabbitmq" if os.environ.get("DIO_AMQP_URL") else "redis",
                        help="brokers the relay's throughput is measured on, side by side "
                             "(default: redis,rabbitmq when DIO_AMQP_URL is set, else redis)")
    parser.add_argument("--publish-rounds", type=int, default=6,
                        help="interleaved rounds of publish() against the plain insert")
    parser.add_argument("--publish-transactions", type=int, default=20,
                        help="transactions of 100 messages per round and kind")
    kinds = ["throughput", "publish", "latency", "memory", "unrelated", "failover"]
    parser.add_argument("--only", choices=kinds, action="append",
                        help="run only these measurements (default: all)")
    args = parser.parse_args()
    only = set(args.only or kinds)
    log(f"machine: {os.cpu_count()} cores; PostgreSQL, Redis"
        f"{' and RabbitMQ' if 'rabbitmq' in args.brokers else ''} of scripts/services")
    setup_database()
    if "throughput" in only:
        log(f"broker: Redis with {broker_durability()}")
        base = bench_baseline(args.messages)
        log(f"baseline (minimal relay, raw list): {base:,.0f} messages/s "
            f"({args.messages:,} messages; no fence, no offset, no Celery format)")
        rate, cpu = bench_relay(args.messages)
        floor = bench_broker_floor(args.messages)
        log(f"relay -> Redis (Celery transport): {rate:,.0f} messages/s, relay CPU {cpu:.1f} µs "
            f"per message ({args.messages:,} messages; target >= 10,000 and >= 0.50 x the "
            f"broker's floor: {rate / floor:.2f} x; {rate / base:.2f} x the baseline)")
        log(f"... Redis alone taking those Celery messages (pre-built, 1,000 per LPUSH): "
            f"{floor:,.0f} messages/s = {floor / base:.2f} x the baseline")
        signed, signed_cpu = bench_relay(args.messages, signed=True)
        log(f"... every envelope signed:         {signed:,.0f} messages/s, relay CPU "
            f"{signed_cpu:.1f} µs per message (SIGNING_KEYS; {signed / base:.2f} x the baseline)")
        if "rabbitmq" in args.brokers:
            amqp, amqp_cpu = bench_relay(args.messages, on="rabbitmq")
            amqp_floor = bench_broker_floor(args.messages, on="rabbitmq")
            log(f"relay -> RabbitMQ (Celery transport, each batch confirmed): {amqp:,.0f} "
                f"messages/s, relay CPU {amqp_cpu:.1f} µs per message ({args.messages:,} "
                f"messages; {amqp / amqp_floor:.2f} x the broker's floor, target >= 0.50)")
            log(f"... RabbitMQ alone taking those Celery messages (pre-built, confirmed "
                f"1,000 at a time): {amqp_floor:,.0f} messages/s")
        rate = bench_consumer(args.messages)
        log(f"consumer, no-op handler:           {rate:,.0f} messages/s "
            f"({args.messages:,} messages, {TENANTS} tenants; target >= 10,000)")
    if "publish" in only:
        r = bench_publish(args.publish_rounds, args.publish_transactions)
        med = {k: statistics.median(v) for k, v in r.items()}
        per_round = [a / b for a, b in zip(r["publish rate"], r["plain rate"], strict=True)]
        for name in ("publish", "plain"):
            label = "publish()" if name == "publish" else "plain INSERT, no trigger"
            log(f"{label:<25} {med[name + ' rate']:,.0f} messages/s (100 per transaction), "
                f"CPU per message {med[name + ' cpu']:.1f} µs here + {med[name + ' db']:.1f} µs "
                "PostgreSQL")
        ratio = med["publish rate"] / med["plain rate"]
        by_cpu = (med["plain cpu"] + med["plain db"]) / (med["publish cpu"] + med["publish db"])
        log(f"publish / plain insert = {ratio:.2f} (per round {min(per_round):.2f}-"
            f"{max(per_round):.2f}; by CPU {by_cpu:.2f}); target >= 0.85: "
            f"{'met' if ratio >= 0.85 else 'NOT met'}")
    if "latency" in only:
        p50, p99, worst = bench_latency(args.latency_messages, args.rate)
        log(f"commit-to-publish latency:         p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
            f"max {worst:.1f} ms ({args.latency_messages:,} messages at {args.rate:.0f}/s; "
            "target p50 <= 50 ms)")
    if "unrelated" in only:
        n = 20
        r = bench_open_transaction(n, args.unrelated_hold, publishing=False)
        log(f"unrelated transaction open {r['held_s']:.0f} s (xid {r['xid']:.0f}): "
            f"{r['delivered_while_open']:.0f} of {n} delivered while it was open "
            f"(p50 {r['p50_ms']:.1f} ms, max {r['max_ms']:.1f} ms), "
            f"{r['delivered_after']:.0f} only after it ended "
            "(target: all 20, each within about the p99 latency)")
        r = bench_open_transaction(n, args.unrelated_hold, publishing=True)
        log(f"a transaction that published open {r['held_s']:.0f} s: "
            f"{r['delivered_while_open']:.0f} of {n} other tenants' messages delivered while it "
            f"was open (p50 {r['p50_ms']:.1f} ms, max {r['max_ms']:.1f} ms), "
            f"{r['delivered_after']:.0f} only after it ended (target: all 20); its own "
            f"tenant's {r['own']:.0f} later messages: {r['own_early']:.0f} delivered while it "
            f"was open (must be 0), {r['own_after']:.0f} after it ended")
    if "failover" in only:
        r = bench_failover(args.failover_messages)
        log(f"relay SIGKILLed mid-drain, a second one waiting: drain after the kill "
            f"{r['drain_s']:.2f} s (first message from the new relay after "
            f"{r['takeover_s']:.2f} s), {r['duplicates']:.0f} duplicate(s), "
            f"{r['lost']:.0f} lost ({r['messages']:,.0f} messages, "
            f"{r['before_kill']:,.0f} in Redis at the kill; target <= 2 s, lost 0)")
    if "memory" not in only:
        return
    samples = bench_memory(args.backlog)
    for name, points in samples.items():
        shown = ", ".join(f"{n:,}: {mb:.0f} MB" for n, mb in points[:: max(len(points) // 5, 1)])
        growth = points[-1][1] - points[0][1]
        log(f"{name} RSS over a {args.backlog:,}-message backlog: {shown} "
            f"(growth {growth:+.1f} MB after the first batch)")


if __name__ == "__main__":
    main()
