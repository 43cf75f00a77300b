"""Benchmark: the same DRF create endpoint with and without IdempotentViewMixin.

Run with ``make bench-idempotency`` (it starts a private PostgreSQL). Three
workloads are measured in the same run, interleaved over several rounds, under
gunicorn (several sync workers) driven by wrk over keep-alive connections:

- plain:  POST /tenant-orders/  the create, under tenant_context, no mixin
- first:  POST /orders/         the same create, a new Idempotency-Key each time
- replay: POST /orders/         a key that has already been answered
- verified first: POST /orders/ a new key, on a second server whose database
  is in the verified tenant context (docs/roles.md), with its own database

It prints requests/s for each (the median over rounds) and the ratios that
DESIGN.md and docs/roles.md set targets for: first/plain >= 0.90, replay/plain
>= 1.5, and verified first/first >= 0.95.
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


VERIFIED_DB_SUFFIX = "_verified"


def setup_verified_database() -> None:
    """The same database under another name, with the verified mode on (in a subprocess:
    the settings read the database's name and the mode from the environment)."""
    subprocess.run(
        [sys.executable, "-c", "import django; django.setup();"
         " from tests.dbsetup import recreate_database; recreate_database()"],
        cwd=ROOT, check=True, env=verified_env(),
    )


def verified_env() -> dict[str, str]:
    return {
        **os.environ,
        "DIO_TEST_DB": os.environ["DIO_TEST_DB"] + VERIFIED_DB_SUFFIX,
        "DIO_VERIFIED_CONTEXT": "1",
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }


def start_server(
    port: int, workers: int, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
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
        env=env or {**os.environ},
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
    setup_verified_database()
    from tests.live import free_port

    port = free_port()
    server = start_server(port, args.workers)
    verified_port = free_port()
    verified_server = start_server(verified_port, args.workers, verified_env())
    base = f"http://127.0.0.1:{port}"
    verified_base = f"http://127.0.0.1:{verified_port}"
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
        run_wrk(wrk, base + "/tenant-orders/", LUA_COMMON, 2, args.connections, "warm")
        run_wrk(wrk, base + "/orders/", LUA_FIRST, 2, args.connections, "warm")
        run_wrk(wrk, verified_base + "/orders/", LUA_FIRST, 2, args.connections, "warm")

        results: dict[str, list[float]] = {"plain": [], "first": [], "replay": [], "verified": []}
        for r in range(args.rounds):
            results["plain"].append(
                run_wrk(
                    wrk,
                    base + "/tenant-orders/",
                    LUA_COMMON,
                    args.seconds,
                    args.connections,
                    f"r{r}",
                )
            )
            results["first"].append(
                run_wrk(wrk, base + "/orders/", LUA_FIRST, args.seconds, args.connections, f"r{r}")
            )
            results["replay"].append(
                run_wrk(wrk, base + "/orders/", LUA_REPLAY, args.seconds, args.connections, f"r{r}")
            )
            results["verified"].append(
                run_wrk(
                    wrk, verified_base + "/orders/", LUA_FIRST, args.seconds, args.connections,
                    f"r{r}",
                )
            )
            print(
                f"round {r + 1}/{args.rounds}: "
                + ", ".join(f"{k} {v[-1]:.0f}/s" for k, v in results.items()),
                flush=True,
            )
    finally:
        for proc in (server, verified_server):
            proc.terminate()
            proc.wait(10)

    med = {k: statistics.median(v) for k, v in results.items()}
    print()
    print(
        f"gunicorn {args.workers} sync workers, wrk {args.connections} connections, "
        f"{args.rounds} rounds x {args.seconds} s, median requests/s"
    )
    print(f"  plain create (no mixin)      {med['plain']:8.0f}")
    print(f"  idempotent, first request    {med['first']:8.0f}")
    print(f"  idempotent, replay           {med['replay']:8.0f}")
    print(f"  idempotent, first, verified  {med['verified']:8.0f}   (verified tenant context)")
    print(f"  first / plain   = {med['first'] / med['plain']:.2f}   (target >= 0.90)")
    print(f"  replay / plain  = {med['replay'] / med['plain']:.2f}   (target >= 1.50)")
    print(f"  verified first / first = {med['verified'] / med['first']:.2f}   (target >= 0.95)")


if __name__ == "__main__":
    main()
