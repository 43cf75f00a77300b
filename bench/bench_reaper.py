"""make bench-reaper: reaping 1,000,000 expired keys under live traffic.

    . .run/env && .venv/bin/python bench/bench_reaper.py [--keys 1000000] [--seconds 20]

DESIGN.md's target: reaping 1,000,000 expired keys under live traffic, no
batch holds locks longer than 100 ms and the foreground p99 grows by at most
10 %. This bench, against the private PostgreSQL of scripts/services:

1. creates the database ``dio_bench_reaper`` as the tests do and inserts the
   expired keys (``generate_series``, as the superuser observer), spread over
   several tenants, among them the two that the traffic uses;
2. starts gunicorn on ``tests.wsgi`` and drives ``POST /orders/`` with wrk at a
   steady, moderate rate (each connection waits ``--think-ms`` between its
   requests, so the server is not saturated: latency then measures the
   interference, not a queue): half the requests carry a new Idempotency-Key,
   half replay a finished one; two users, two tenants;
3. measures the foreground latency without reaping, then while
   ``idempotency.reaper.reap_expired_keys`` runs in a process of its own (the
   window lasts exactly as long as the reaper), then without reaping again;
4. prints keys deleted, batches, the longest batch (its transaction holds the
   row locks) and the batches' p50/p99, and the p99 with and without reaping.

The baseline is the mean of the windows before and after (the table and the
caches change in between). The machine is shared: repeat runs and read medians.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # run from the project root, not from bench/

os.environ.setdefault("DIO_TEST_DB", "dio_bench_reaper")
os.environ.setdefault("DIO_CONN_MAX_AGE", "600")  # persistent connections, as deployed
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

BODY = '{"sku": "tea", "quantity": 2, "note": "benchmark order"}'

#: Requests cycle: new key as alice, new key as bob, replay as alice, replay as bob.
LUA = f"""
wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
local counter = 0
local prefix = ""
local think = 0
function init(args)
  prefix = (args[1] or "run") .. "-" .. tid .. "-"
  think = tonumber(args[2] or "0")
end
local users = {{"alice", "bob"}}
function request()
  counter = counter + 1
  wrk.headers["X-User"] = users[counter % 2 + 1]
  if counter % 4 < 2 then
    wrk.headers["Idempotency-Key"] = prefix .. counter
  else
    wrk.headers["Idempotency-Key"] = "replayed-key"
  end
  return wrk.format()
end
function delay()
  return think
end
function done(summary, latency, requests)
  io.write(string.format("RESULT requests=%d non2xx=%d errors=%d p50=%d p90=%d p99=%d max=%d\\n",
    summary.requests, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""

#: The reaper's process: per-batch timings from the progress callback, then
#: the report, as JSON on the last line. ``--pause-ms`` overrides the library's
#: pause between batches (default: the reaper's own, ``idempotency.conf.REAP_PAUSE``).
#: ``--async-commit`` runs the reaper's session with ``synchronous_commit=off``
#: (PGOPTIONS): its commits then do not wait for the WAL flush (a batch lost in
#: a crash is reaped again).
CHILD = """
import json, os, sys, time
sys.path.insert(0, os.getcwd())
import django
django.setup()
from idempotency.conf import REAP_BATCH_SIZE, REAP_PAUSE
from idempotency.reaper import reap_expired_keys
size = int(sys.argv[1]) or REAP_BATCH_SIZE
pause = REAP_PAUSE if sys.argv[2] == "default" else float(sys.argv[2]) / 1000
marks = [time.monotonic()]
gaps = []
def progress(line):
    now = time.monotonic()
    gaps.append(now - marks[-1])
    marks.append(now)
report = reap_expired_keys(batch_size=size, pause=pause, progress=progress)
print(json.dumps({**report.as_dict(), "gaps": gaps}))
"""


def log(text: str) -> None:
    print(text, flush=True)


def setup_database() -> None:
    import django

    django.setup()
    from tests.dbsetup import recreate_database

    drop_database()  # as the superuser: an autovacuum worker may still be busy in it
    recreate_database()


def drop_database() -> None:
    """Drop the bench's database (its autovacuum would otherwise go on after the bench)."""
    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    with psycopg.connect(host=os.environ.get("DIO_PGSOCKET") or db["HOST"], port=db["PORT"],
                         user="postgres", dbname="postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db["NAME"]}" WITH (FORCE)')


def insert_expired(count: int, tenants: int, chunk: int = 100_000) -> float:
    """``count`` finished keys that expired over the last day, tenants interleaved.

    Rows are written in the order they expire, as a constant TTL would leave
    them: one tenant's next batch of expired keys lies in neighbouring heap pages.
    """
    from tests.helpers import observer

    started = time.perf_counter()
    with observer() as conn:
        for first in range(0, count, chunk):
            last = min(first + chunk, count) - 1
            conn.execute(
                """
                INSERT INTO idempotency_keys
                       (tenant_id, scope, key, request_hash, request_method, request_path,
                        state, status_code, response, response_headers, created_at,
                        completed_at, expires_at)
                SELECT g %% %s + 1, 'order.create', 'expired-' || g,
                       md5(g::text) || md5((g + 1)::text), 'POST', '/orders/',
                       'completed', 201,
                       convert_to('{"id": ' || g || ', "sku": "tea", "quantity": 2}', 'UTF8'),
                       '{"Content-Type": "application/json"}'::jsonb,
                       e - interval '24 hours', e - interval '24 hours', e
                  FROM generate_series(%s::bigint, %s::bigint) AS g,
                       LATERAL (SELECT now() - interval '1 minute'
                                       - (%s - g) * (interval '1 day' / %s) AS e) AS t
                """,
                [tenants, first, last, count, count],
            )
        conn.execute("VACUUM ANALYZE idempotency_keys")
        conn.execute("CHECKPOINT")
    return time.perf_counter() - started


def explain_batch(tenant_id: int, size: int) -> str:
    """The plan of one batch delete, executed and rolled back."""
    from idempotency.store import SQL
    from tests.helpers import observer

    with observer() as conn, conn.transaction(force_rollback=True):
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + SQL["delete_expired_batch"],
                            {"tenant_id": int(tenant_id), "limit": int(size)}).fetchall()
    return "\n".join(row[0] for row in rows)


class Traffic:
    """wrk against the server; ``stop()`` ends a run early (wrk prints its results on SIGINT)."""

    def __init__(self, wrk: str, url: str, connections: int, think_ms: int) -> None:
        self.wrk, self.url = wrk, url
        self.connections, self.think_ms = connections, think_ms
        handle = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)
        with handle:
            handle.write(LUA)
        self.script = handle.name
        self.rounds = 0

    def start(self, seconds: int) -> subprocess.Popen[str]:
        self.rounds += 1
        return subprocess.Popen(
            [self.wrk, "-t", "2", "-c", str(self.connections), "-d", f"{seconds}s",
             "--latency", "-s", self.script, self.url, "--",
             f"r{self.rounds}-{os.getpid()}", str(self.think_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )

    @staticmethod
    def result(proc: subprocess.Popen[str], seconds: float) -> dict[str, float]:
        out, _ = proc.communicate()
        found = re.search(
            r"RESULT requests=(\d+) non2xx=(\d+) errors=(\d+) p50=(\d+) p90=(\d+) p99=(\d+)"
            r" max=(\d+)", out,
        )
        if not found:
            sys.exit(f"bench: wrk gave no result\n{out}")
        requests, non2xx, errors, p50, p90, p99, worst = (int(x) for x in found.groups())
        if non2xx or errors:
            sys.exit(f"bench: {non2xx} answers were not 2xx, {errors} socket errors\n{out}")
        return {"rate": requests / seconds, "p50": p50 / 1000, "p90": p90 / 1000,
                "p99": p99 / 1000, "max": worst / 1000}

    def run(self, seconds: int) -> dict[str, float]:
        return self.result(self.start(seconds), seconds)

    def close(self) -> None:
        os.unlink(self.script)


def reap_under(
    traffic: Traffic, batch_size: int | None, pause_ms: float | None, async_commit: bool
) -> tuple[dict, dict[str, float]]:
    """Run the reaper in its own process while wrk runs; wrk stops when the reaper ends."""
    wrk = traffic.start(3600)
    time.sleep(1.0)  # wrk's connections are up
    started = time.perf_counter()
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(batch_size or 0),
         "default" if pause_ms is None else str(pause_ms)], cwd=ROOT,
        env={**os.environ, **({"PGOPTIONS": "-c synchronous_commit=off"} if async_commit else {})},
        capture_output=True, text=True,
    )
    elapsed = time.perf_counter() - started
    wrk.send_signal(signal.SIGINT)
    load = traffic.result(wrk, elapsed + 1.0)
    if child.returncode:
        sys.exit(f"bench: the reaper failed\n{child.stdout}\n{child.stderr}")
    return json.loads(child.stdout.strip().splitlines()[-1]), load


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="expired keys to reap")
    parser.add_argument("--tenants", type=int, default=8, help="tenants the keys spread over")
    parser.add_argument("--seconds", type=int, default=20, help="each baseline window")
    parser.add_argument("--connections", type=int, default=8, help="wrk connections")
    parser.add_argument("--think-ms", type=int, default=20,
                        help="pause of each connection between its requests")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn workers")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="rows per reaper batch (default: the reaper's, 100)")
    parser.add_argument("--pause-ms", type=float, default=None,
                        help="pause between batches (default: the reaper's, 10 ms)")
    parser.add_argument("--async-commit", action="store_true",
                        help="run the reaper's session with synchronous_commit=off (experiment)")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--explain", action="store_true",
                        help="print the plan of one batch delete (rolled back) first")
    args = parser.parse_args()

    from bench.bench_idempotency import ensure_wrk, start_server

    wrk = ensure_wrk()
    log(f"machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    setup_database()
    seconds = insert_expired(args.keys, args.tenants)
    log(f"inserted {args.keys:,} expired keys over {args.tenants} tenants in {seconds:.1f} s")
    if args.explain:
        from idempotency.conf import REAP_BATCH_SIZE

        log(explain_batch(1, args.batch_size or REAP_BATCH_SIZE))

    from tests.live import free_port

    port = free_port()
    server = start_server(port, args.workers)
    base = f"http://127.0.0.1:{port}"
    traffic = Traffic(wrk, base + "/orders/", args.connections, args.think_ms)
    try:
        import requests

        for user in ("alice", "bob"):
            first = requests.post(base + "/orders/", data=BODY, headers={
                "Content-Type": "application/json", "X-User": user,
                "Idempotency-Key": "replayed-key"})
            assert first.status_code == 201, first.text
        traffic.run(3)  # warm-up: every worker, the caches
        before = traffic.run(args.seconds)
        log(f"without reaping: {before['rate']:.0f} requests/s, p50 {before['p50']:.1f} ms, "
            f"p99 {before['p99']:.1f} ms")
        report, during = reap_under(traffic, args.batch_size, args.pause_ms, args.async_commit)
        log(f"while reaping:   {during['rate']:.0f} requests/s, p50 {during['p50']:.1f} ms, "
            f"p99 {during['p99']:.1f} ms")
        after = traffic.run(args.seconds)
        log(f"without reaping: {after['rate']:.0f} requests/s, p50 {after['p50']:.1f} ms, "
            f"p99 {after['p99']:.1f} ms")
    finally:
        traffic.close()
        server.terminate()
        server.wait(10)
        if not args.keep:
            drop_database()

    gaps = [g * 1000 for g in report["gaps"]]
    baseline = (before["p99"] + after["p99"]) / 2
    log("")
    log(f"keys deleted:       {report['deleted']:,} in {report['batches']:,} batches, "
        f"{report['tenants']} tenants, {report['seconds']:.1f} s "
        f"({report['deleted'] / max(report['seconds'], 1e-9):,.0f} keys/s)")
    log(f"longest batch:      {report['longest_batch_seconds'] * 1000:.1f} ms "
        f"(target <= 100 ms); batch to batch (pause included) p50 "
        f"{statistics.median(gaps) if gaps else 0:.1f} ms, p99 {percentile(gaps, 0.99):.1f} ms")
    log(f"foreground p99:     {baseline:.1f} ms without reaping "
        f"(before {before['p99']:.1f}, after {after['p99']:.1f}), "
        f"{during['p99']:.1f} ms while reaping")
    log(f"p99 ratio:          {during['p99'] / baseline:.2f} (target <= 1.10); "
        f"requests/s {during['rate']:.0f} vs {(before['rate'] + after['rate']) / 2:.0f}")


if __name__ == "__main__":
    main()
