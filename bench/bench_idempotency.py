"""Benchmark: the same DRF create endpoint with and without IdempotentViewMixin.

Run with ``make bench-idempotency`` (it starts a private PostgreSQL). Four
workloads are measured in the same run, interleaved over several rounds, under
gunicorn (several sync workers) driven by wrk over keep-alive connections:

- plain:  POST /plain-orders/   the create in autocommit: one INSERT, no tenant
                                context, no mixin, into a table of the same shape
                                without row-level security (what other idempotency
                                packages are compared with)
- tenant: POST /tenant-orders/  the create under tenant_context, no mixin (what
                                a plain endpoint costs an RLS user)
- first:  POST /orders/         the idempotent create, a new Idempotency-Key each time
- replay: POST /orders/         a key that has already been answered

It prints requests/s for each (the median over rounds, with the range) and the
four ratios; DESIGN.md's targets hold against the autocommit baseline:
first/plain >= 0.90 and replay/plain >= 1.5.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # run from the project root, not from bench/

BODY = '{"sku": "tea", "quantity": 2, "note": "benchmark order"}'

LUA_COMMON = f"""
wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-User"] = "alice"
"""

LUA_FIRST = (
    LUA_COMMON
    + """
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
local counter = 0
local prefix = ""
function init(args)
  prefix = (args[1] or "run") .. "-" .. tid .. "-"
end
function request()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = prefix .. counter
  return wrk.format()
end
"""
)

LUA_REPLAY = (
    LUA_COMMON
    + """
wrk.headers["Idempotency-Key"] = "replayed-key"
"""
)

LUA_CHECK = """
function done(summary, latency, requests)
  io.write(string.format("non2xx=%d\\n", summary.errors.status))
end
"""


def ensure_wrk() -> str:
    path = shutil.which("wrk")
    if path:
        return path
    if os.geteuid() != 0:
        sys.exit("bench: wrk is not installed (Debian package 'wrk'); install it and rerun.")
    print("bench: installing wrk with apt-get", flush=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False, capture_output=True)
    if not shutil.which("wrk"):
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, capture_output=True)
    return shutil.which("wrk") or sys.exit("bench: could not install wrk")


def setup_database() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()
    from tests.dbsetup import recreate_database

    recreate_database()


def start_server(port: int, workers: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "tests.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--worker-class",
            "sync",
            "--log-level",
            "warning",
            "--timeout",
            "60",
        ],
        cwd=ROOT,
        env={**os.environ},
    )
    import requests

    for _ in range(300):
        try:
            requests.get(f"http://127.0.0.1:{port}/orders/", timeout=1)
            return proc
        except requests.RequestException:  # not up yet, or slow to answer the first time
            time.sleep(0.1)
    proc.kill()
    sys.exit("bench: gunicorn did not start")


def run_wrk(wrk: str, url: str, script: str, seconds: int, connections: int, arg: str) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script + LUA_CHECK)
    try:
        out = subprocess.run(
            [
                wrk,
                "-t",
                "2",
                "-c",
                str(connections),
                "-d",
                f"{seconds}s",
                "-s",
                f.name,
                url,
                "--",
                arg,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        os.unlink(f.name)
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    bad = int(re.search(r"non2xx=(\d+)", out).group(1))  # type: ignore[union-attr]
    if bad:
        sys.exit(f"bench: {bad} answers were not 2xx for {url}\n{out}")
    return rate


WORKLOADS = {
    # name: (path, wrk script, label)
    "plain": ("/plain-orders/", LUA_COMMON, "plain create, autocommit, no RLS"),
    "tenant": ("/tenant-orders/", LUA_COMMON, "plain create in tenant_context"),
    "first": ("/orders/", LUA_FIRST, "idempotent, first request"),
    "replay": ("/orders/", LUA_REPLAY, "idempotent, replay"),
}

RATIOS = [
    # (numerator, denominator, target or None)
    ("first", "plain", 0.90),
    ("replay", "plain", 1.50),
    ("first", "tenant", None),
    ("replay", "tenant", None),
]


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8, help="duration of each measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--connections", type=int, default=16, help="concurrent clients")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn workers")
    args = parser.parse_args()

    wrk = ensure_wrk()
    os.environ.setdefault("DIO_TEST_DB", "dio_bench")
    os.environ.setdefault("DIO_CONN_MAX_AGE", "600")  # persistent connections, as deployed
    setup_database()
    from tests.live import free_port

    port = free_port()
    server = start_server(port, args.workers)
    base = f"http://127.0.0.1:{port}"
    loads = [load_average()]
    try:
        import requests

        first = requests.post(
            base + "/orders/",
            data=BODY,
            headers={
                "Content-Type": "application/json",
                "X-User": "alice",
                "Idempotency-Key": "replayed-key",
            },
        )
        assert first.status_code == 201, first.text
        # Warm up every worker and the database caches.
        for path, script, _ in WORKLOADS.values():
            run_wrk(wrk, base + path, script, 2, args.connections, "warm")

        results: dict[str, list[float]] = {name: [] for name in WORKLOADS}
        for r in range(args.rounds):
            # Rotate the order each round, so that no workload always follows
            # the same one (autovacuum and checkpoints land on all of them).
            names = list(WORKLOADS)
            names = names[r % len(names):] + names[: r % len(names)]
            for name in names:
                path, script, _ = WORKLOADS[name]
                results[name].append(
                    run_wrk(wrk, base + path, script, args.seconds, args.connections, f"r{r}")
                )
            loads.append(load_average())
            print(
                f"round {r + 1}/{args.rounds} (load {loads[-1]}): "
                + ", ".join(f"{k} {v[-1]:.0f}/s" for k, v in results.items()),
                flush=True,
            )
    finally:
        server.terminate()
        server.wait(10)

    med = {k: statistics.median(v) for k, v in results.items()}
    print()
    print(
        f"gunicorn {args.workers} sync workers, wrk {args.connections} connections, "
        f"{args.rounds} rounds x {args.seconds} s, median requests/s (min-max); "
        f"load average {loads[0]} at the start, {loads[-1]} at the end"
    )
    for name, (path, _, label) in WORKLOADS.items():
        values = results[name]
        print(
            f"  {name:<7} {label:<36} {path:<16} {med[name]:8.0f}"
            f"   ({min(values):.0f}-{max(values):.0f})"
        )
    for top, bottom, target in RATIOS:
        per_round = [a / b for a, b in zip(results[top], results[bottom], strict=True)]
        line = (
            f"  {top} / {bottom:<6} = {med[top] / med[bottom]:.2f}"
            f"   (per round {min(per_round):.2f}-{max(per_round):.2f})"
        )
        if target is not None:
            line += f"   target >= {target:.2f}"
        print(line)


if __name__ == "__main__":
    main()
