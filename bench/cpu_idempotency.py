"""make bench-idempotency-cpu: where a request's CPU goes, without an HTTP server.

    . .run/env && .venv/bin/python bench/cpu_idempotency.py [--requests 1000] [--rounds 3]

``make bench-idempotency`` measures requests/s under gunicorn and wrk, where
the HTTP server's own work per request (about 2 ms of a worker's CPU on a
small machine) is the same for every workload and narrows every ratio. This
script calls the same Django application in-process, one request after the
other on one persistent connection, and measures the CPU each workload costs
this process (Django, DRF, the library) and the PostgreSQL cluster, side by
side in one run (workloads interleaved, the median of the rounds):

- plain, tenant, first, replay: the workloads of ``make bench-idempotency``,
  each with its round trips per request (counted on the wire, from libpq's
  trace of one request) and the ratios that CPU allows against the
  tenant-scoped create, with the design's targets;
- then the cost of one statement through each layer, to show what is left to
  cut: Django's cursor against psycopg's own, and the replay's lookup parsed
  and planned each time (the same query sent as text) against the function
  the library calls (idempotency_lookup(), planned once per server session).
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # run from the project root, not from bench/
os.environ.setdefault("DIO_TEST_DB", "dio_bench_cpu")
os.environ["DIO_CONN_MAX_AGE"] = "600"  # persistent connections, as deployed
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"

from bench.bench_idempotency import (  # noqa: E402
    RATIOS,
    children,
    cpu_seconds,
    load_average,
    postmaster_pid,
    seed,
)

BODY = b'{"sku": "tea", "quantity": 2, "note": "benchmark order"}'


def round_trips(call: Callable[[], Any], alias: str = "default") -> int:
    """How many messages ``call`` sends on Django's connection ``alias``: one per round trip.

    Counted from libpq's own trace (every Query message, or every Sync of the
    extended protocol, is one round trip), as tests/idempotency/test_upstream.py
    counts them.
    """
    import tempfile

    from django.db import connections
    from psycopg import pq

    connection = connections[alias]
    connection.ensure_connection()
    with tempfile.TemporaryFile("w+") as trace:
        pgconn = connection.connection.pgconn
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            call()
        finally:
            if connection.connection is not None and not connection.connection.closed:
                connection.connection.pgconn.untrace()
        trace.flush()
        trace.seek(0)
        return sum(1 for line in trace if line.startswith("F\t")
                   and line.split("\t")[2] in ("Query", "Sync"))


def cluster_pids() -> list[int]:
    """The postmaster and its children (every process of the private cluster)."""
    postmaster = postmaster_pid()
    if postmaster is None:
        raise SystemExit("bench-idempotency-cpu: the private PostgreSQL is not running")
    return [postmaster, *children(postmaster)]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--round-trips", action="store_true",
                        help="only print each workload's round trips per request (JSON), on the"
                             " database DIO_TEST_DB names as it is (make bench-idempotency asks)")
    args = parser.parse_args()

    import django

    django.setup()
    from tests.dbsetup import recreate_database

    if not args.round_trips:
        recreate_database()
        seed(os.environ["DIO_TEST_DB"])  # a day's keys, analyzed, as in production
    from django.core.handlers.wsgi import WSGIHandler

    app = WSGIHandler()
    counter = itertools.count()
    run = f"cpu-{time.time_ns()}"

    def environ(path: str, key: str | None = None) -> dict[str, Any]:
        env = {
            "REQUEST_METHOD": "POST", "PATH_INFO": path, "SERVER_NAME": "localhost",
            "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(BODY), "CONTENT_LENGTH": str(len(BODY)),
            "CONTENT_TYPE": "application/json", "HTTP_X_USER": "alice", "wsgi.errors": sys.stderr,
        }
        if key is not None:
            env["HTTP_IDEMPOTENCY_KEY"] = key
        return env

    def call(env: dict[str, Any]) -> None:
        status: list[str] = []
        b"".join(app(env, lambda s, h, *rest: status.append(s)))  # type: ignore[arg-type]
        if not status[0].startswith("2"):
            sys.exit(f"bench: {env['PATH_INFO']} answered {status[0]}")

    workloads: dict[str, Callable[[], dict[str, Any]]] = {
        "plain": lambda: environ("/plain-orders/"),
        "tenant": lambda: environ("/tenant-orders/"),
        "first": lambda: environ("/orders/", f"{run}-{next(counter)}"),
        "replay": lambda: environ("/orders/", "replayed-key"),
    }
    call(environ("/orders/", "replayed-key"))
    for make in workloads.values():  # connections open, statements prepared
        call(make())
    trips = {name: round_trips(lambda make=make: call(make())) for name, make in workloads.items()}
    if args.round_trips:
        print(json.dumps(trips))
        return
    cluster = cluster_pids()
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in workloads}
    for r in range(args.rounds):
        names = list(workloads)
        names = names[r % len(names):] + names[: r % len(names)]  # rotated each round
        for name in names:
            make = workloads[name]
            for _ in range(50):
                call(make())
            own, db = time.process_time(), cpu_seconds(cluster)
            for _ in range(args.requests):
                call(make())
            per = 1000 / args.requests
            measured[name].append(((time.process_time() - own) * per,
                                   (cpu_seconds(cluster) - db) * per))

    print(f"{args.rounds} rounds x {args.requests} requests, in-process, one connection"
          f" (load average {load_average()} at the end)")
    print("  workload  round trips  CPU ms per request (median): this process + PostgreSQL")
    totals = {}
    for name, runs in measured.items():
        own = statistics.median(r[0] for r in runs)
        db = statistics.median(r[1] for r in runs)
        totals[name] = own + db
        print(f"  {name:8} {trips[name]:6d}        {own:5.2f} + {db:5.2f} = {own + db:5.2f}")
    print("  requests/s ratios this CPU allows (CPU-bound, no HTTP server's share):")
    for top, bottom, target in RATIOS:
        if top not in totals or bottom not in totals:
            continue  # the verified context is measured by make bench-idempotency only
        ratio = totals[bottom] / totals[top]
        line = f"  {top:7} / {bottom:6} = {ratio:.2f}"
        if target is not None:
            line += f"   target >= {target:.2f}: {'met' if ratio >= target else 'NOT met'}"
        print(line)
    statements()


def statements(n: int = 3000) -> None:
    """One statement's cost through Django's cursor and psycopg's; the key's read as the
    library sends it (idempotency_lookup(), planned once per server session) and as the
    same query sent as text (parsed and planned every time)."""
    import psycopg
    from django.db import connections

    from idempotency import store
    from idempotency.core import IdempotentRequest
    from tenancy.context import search_path_sql, set_tenant_sql

    django_conn = connections["default"]
    django_conn.ensure_connection()
    raw = django_conn.connection
    backend = [raw.info.backend_pid]
    request = IdempotentRequest(tenant_id=1, scope="order.create", key="replayed-key",
                                fingerprint="")
    cursor = psycopg.ClientCursor(raw)
    # The replay's one message, as idempotency.store.peek sends it.
    head = f"{set_tenant_sql(1)}; {search_path_sql('default')}; "
    params = {**store._key(request), "lock_id": None}
    call = cursor.mogrify(head + store.SQL["lookup"], params)
    # The function's query, as text, with the same values.
    cursor.execute("SELECT pg_get_functiondef('idempotency_lookup(bigint, text, text, bigint)'"
                   "::regprocedure)")
    body = cursor.fetchone()[0].split("RETURN QUERY", 1)[1].rsplit(";", 1)[0]
    for name, value in (("p_tenant_id", "1"), ("p_scope", "'order.create'"),
                        ("p_key", "'replayed-key'"), ("p_lock_id", "NULL::bigint")):
        body = body.replace(name, value)
    text = head + body

    def django_select() -> None:
        with django_conn.cursor() as c:
            c.execute("SELECT 1")
            c.fetchone()

    cases: list[tuple[str, Callable[[], Any]]] = [
        ("SELECT 1 through Django's cursor", django_select),
        ("SELECT 1 through psycopg's cursor", lambda: cursor.execute("SELECT 1")),
        ("the replay's lookup, as text", lambda: cursor.execute(text)),
        ("the replay's lookup, idempotency_lookup()", lambda: cursor.execute(call)),
    ]
    print(f"one statement ({n:,} times each), microseconds: client CPU, server CPU")
    for label, run in cases:
        for _ in range(200):
            run()
        own, server = time.process_time(), cpu_seconds(backend)
        for _ in range(n):
            run()
        print(f"  {label:42} {(time.process_time() - own) * 1e6 / n:6.0f}"
              f" {(cpu_seconds(backend) - server) * 1e6 / n:6.0f}")


if __name__ == "__main__":
    main()
