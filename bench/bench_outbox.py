"""make bench-outbox: the outbox's throughput, latency and memory, on this machine.

    . .run/env && .venv/bin/python bench/bench_outbox.py [--messages 100000] [--backlog 1000000]

Measures, against the private PostgreSQL and Redis of scripts/services:

1. relay throughput into a real Redis-backed Celery broker (CeleryTransport);
2. in-database consumer throughput with a no-op handler (10 tenants interleaved);
3. commit-to-publish latency, p50/p99: messages published one per transaction
   at a steady rate while ``manage.py relay_outbox`` runs in its own process;
   the time runs from the publisher's COMMIT returning to the message being
   in the Redis list;
4. memory (RSS) of the relay and of a consumer working through a backlog.

Targets (DESIGN.md): relay >= 10,000 messages/s on 2 cores, p50 <= 50 ms;
consumer >= 10,000 messages/s; memory flat as the backlog grows.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # run from the project root, not from bench/
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.outbox_settings"

import django  # noqa: E402

django.setup()

import psycopg  # noqa: E402
import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections, transaction  # noqa: E402

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
    call_command("migrate", database="owner", verbosity=0)
    grants = (ROOT / "tests" / "grants.sql").read_text().format(
        app=settings.DATABASES["default"]["USER"], system=settings.DATABASES["system"]["USER"]
    )
    with connections["owner"].cursor() as cursor:
        cursor.execute(grants)
    connections["owner"].close()


def reset() -> None:
    with observer() as conn:
        conn.execute("TRUNCATE outbox_messages, consumer_offsets RESTART IDENTITY")
        conn.execute("VACUUM ANALYZE outbox_messages")
    broker().delete(QUEUE)


def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


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
    """Wait until every inserted message is below the readers' fence.

    A transaction running anywhere on the server (another test run, an
    autovacuum ANALYZE) holds the fence back; a timed run must not start
    before the backlog is readable.
    """
    deadline = time.monotonic() + timeout
    with observer() as conn:
        while time.monotonic() < deadline:
            behind = conn.execute(
                "SELECT coalesce(max(xid), '0'::xid8) >= pg_snapshot_xmin(pg_current_snapshot())"
                "  FROM outbox_messages"
            ).fetchone()[0]
            if not behind:
                return
            time.sleep(0.05)
    sys.exit("bench: a long transaction on the server holds the outbox fence back")


def bench_relay(count: int) -> float:
    reset()
    backlog(count)
    relay = Relay(name="bench-throughput")
    relay.drain()  # warm-up: connections, imports (also moves everything)
    reset()
    backlog(count)
    relay = Relay(name="bench-throughput")
    started = time.perf_counter()
    sent = relay.drain()
    elapsed = time.perf_counter() - started
    assert sent == count, (sent, count)
    assert broker().llen(QUEUE) == count
    broker().delete(QUEUE)
    return count / elapsed


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
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.outbox_settings"}
    relay = subprocess.Popen(
        [sys.executable, "manage.py", "relay_outbox", "--name", "bench-latency"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--latency-messages", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=200.0, help="published messages/s")
    args = parser.parse_args()
    log(f"machine: {os.cpu_count()} cores; PostgreSQL and Redis of scripts/services")
    setup_database()
    rate = bench_relay(args.messages)
    log(f"relay -> Redis (Celery transport): {rate:,.0f} messages/s "
        f"({args.messages:,} messages; target >= 10,000)")
    rate = bench_consumer(args.messages)
    log(f"consumer, no-op handler:           {rate:,.0f} messages/s "
        f"({args.messages:,} messages, {TENANTS} tenants; target >= 10,000)")
    p50, p99, worst = bench_latency(args.latency_messages, args.rate)
    log(f"commit-to-publish latency:         p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"max {worst:.1f} ms ({args.latency_messages:,} messages at {args.rate:.0f}/s; "
        "target p50 <= 50 ms)")
    samples = bench_memory(args.backlog)
    for name, points in samples.items():
        shown = ", ".join(f"{n:,}: {mb:.0f} MB" for n, mb in points[:: max(len(points) // 5, 1)])
        growth = points[-1][1] - points[0][1]
        log(f"{name} RSS over a {args.backlog:,}-message backlog: {shown} "
            f"(growth {growth:+.1f} MB after the first batch)")


if __name__ == "__main__":
    main()
