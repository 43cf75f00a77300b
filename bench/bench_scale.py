"""make bench-scale: how the library's costs grow with the size of its tables.

    make bench-scale                        # the full sizes (hours; a quiet machine)
    make bench-scale BENCH_ARGS=--quick     # small sizes: the harness, end to end
    make bench-scale BENCH_ARGS="--only keys --key-sizes 10000,1000000"

Each curve of issue 28, measured against the private PostgreSQL, Redis and
pgbouncer of ``scripts/services``, on a database of its own
(``dio_bench_scale``, created as the tests create theirs, ``tests/dbsetup.py``):

keys       new key and replay (requests/s, p50/p99, CPU per request) under
           gunicorn + wrk, with ``idempotency_keys`` holding each size of
           ``--key-sizes`` over ``--tenants`` tenants; requests spread over the
           tenants, replays over keys picked at random from the whole table
pooled     200 client connections (``--clients``) through pgbouncer in
           transaction mode to 20 server sessions (``--server-sessions``):
           the key path's p50/p99 and error rate, beside the same traffic on
           20 direct sessions
reaper     ``--reap-keys`` expired keys reaped (``reap_expired_keys()``, its
           defaults) while paced traffic runs: rows/s, longest batch, the
           traffic's p99 with and without it; table and index sizes after
churn      a day of churn, compressed into ``--churn-steps`` steps: the table
           holds ``--churn-keys`` live keys, each step adds a step's new keys
           and reaps the expired ones; table and index sizes per step, with
           autovacuum as PostgreSQL ships it and with per-table settings
tenants    the relay with 1, 100 and 10,000 tenants publishing
           (``--outbox-tenants``): throughput through a backlog while
           publishers keep transactions in flight, commit-to-broker p50/p99 of
           ``relay_outbox`` at a steady rate, and one transaction publishing
           for every tenant at once
backlog    a ``--backlog`` of messages piling up while the broker is down
           (Redis stopped by ``scripts/services``), then drained by
           ``relay_outbox``: drain rate along the backlog, the relay's RSS, and
           the lag ``outbox.health.check()`` and the metrics report meanwhile
retention  publishing at ``--retention-rate`` messages/hour with
           ``OUTBOX["RETENTION"]`` = ``--retention-seconds`` and ``reap_outbox``
           every ``--reap-every`` seconds: the table's rows and size over time
consumers  10 consumers on one stream, each in a process of its own, at a
           steady rate: their latency; then again with an 11th consumer
           starting ``--behind`` messages behind

Seeding is one ``INSERT ... SELECT ... FROM generate_series`` per chunk, as
the superuser; a chunk of more than ``FAST_SEED`` rows goes into the table
without its indexes, which are then built again from their own definitions
(``pg_get_indexdef``): minutes for 10,000,000 rows, not hours. Keys are copied
from a template row per tenant that a real request wrote (its fingerprint,
scope and answer), so replays of seeded keys are real replays.

With ``pg_stat_statements`` loaded (the bench loads it, restarting the private
PostgreSQL once, unless ``--no-statements``), each point of a curve also
records the statements that took most of the server's time.

Figures go to ``--results`` (JSON, merged phase by phase); then
``bench/scale_report.py`` draws each curve (docs/img/scale/*.png) and writes
the tables into docs/benchmarks.md (``--no-report`` skips it).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # run from the project root, not from bench/

SETTINGS = "bench.scale_settings"
os.environ.setdefault("DIO_TEST_DB", "dio_bench_scale")
os.environ.setdefault("DIO_CONN_MAX_AGE", "600")  # persistent connections, as deployed
os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS

import django  # noqa: E402

django.setup()

# bench_outbox sets its own settings module when imported; ours are loaded already.
from bench import bench_outbox  # noqa: E402

os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS

import psycopg  # noqa: E402
import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connections, transaction  # noqa: E402
from django.test import override_settings  # noqa: E402

from bench.bench_idempotency import (  # noqa: E402
    children,
    cpu_seconds,
    ensure_wrk,
    load_average,
    postmaster_pid,
    start_server,
)
from bench.bench_reaper import Traffic, percentile, reap_under  # noqa: E402
from outbox import publish  # noqa: E402
from outbox.relay import Relay  # noqa: E402
from tenancy import tenant_context  # noqa: E402
from tests.helpers import superuser  # noqa: E402
from tests.live import LiveServer, free_port  # noqa: E402

BODY = '{"sku": "tea", "quantity": 2, "note": "benchmark order"}'
SCOPE_PATH = "/orders/"
#: A chunk larger than this is inserted without the table's indexes (built again after).
FAST_SEED = 200_000
CHUNK = 500_000
RESULTS = ROOT / "bench" / "results" / "scale.json"

FULL: dict[str, Any] = {
    "key_sizes": [10_000, 1_000_000, 10_000_000],
    "tenants": 1000,
    "seconds": 10,
    "rounds": 3,
    "connections": 16,
    "workers": 4,
    "clients": 200,
    "server_sessions": 20,
    "pooled_seconds": 30,
    "reap_keys": 10_000_000,
    "traffic_seconds": 20,
    "churn_keys": 10_000_000,
    "churn_steps": 24,
    "churn_step_seconds": 120.0,
    "outbox_tenants": [1, 100, 10_000],
    "tenant_backlog": 200_000,
    "publishers": 8,
    "rate": 300.0,
    "latency_seconds": 20.0,
    "backlog": 1_000_000,
    "outage_seconds": 60.0,
    "retention_rate": 1_000_000,
    "retention_seconds": 600.0,
    "retention_duration": 3600.0,
    "reap_every": 60.0,
    "consumer_rate": 200.0,
    "consumer_seconds": 60.0,
    "behind": 1_000_000,
}

QUICK: dict[str, Any] = {
    **FULL,
    "key_sizes": [10_000, 100_000, 300_000],
    "seconds": 4,
    "rounds": 1,
    "pooled_seconds": 8,
    "reap_keys": 100_000,
    "traffic_seconds": 6,
    "churn_keys": 50_000,
    "churn_steps": 6,
    "churn_step_seconds": 5.0,
    "tenant_backlog": 20_000,
    "rate": 150.0,
    "latency_seconds": 6.0,
    "backlog": 100_000,
    "outage_seconds": 5.0,
    "retention_seconds": 15.0,
    "retention_duration": 60.0,
    "reap_every": 5.0,
    "consumer_rate": 100.0,
    "consumer_seconds": 10.0,
    "behind": 50_000,
}

#: The catching-up consumer's ``max_rate`` (messages a second) in the consumers phase's
#: third run: ten times the stream's rate, so that it still catches up.
BEHIND_RATE = 2000

PHASES = ["keys", "pooled", "reaper", "churn", "tenants", "backlog", "retention", "consumers"]

#: Per-table autovacuum settings tried against PostgreSQL's defaults in the churn
#: (what docs/scaling.md recommends for idempotency_keys, once measured).
TUNED_AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "10000",
    "autovacuum_vacuum_insert_scale_factor": "0.01",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "1",
}


def log(text: str = "") -> None:
    print(text, flush=True)


# -- results ---------------------------------------------------------------------


class Results:
    """The run's figures, written to ``path`` after every phase (merged with what is there)."""

    def __init__(self, path: Path, run: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {}
        if path.exists():
            self.data = json.loads(path.read_text())
        self.run = run

    def save(self, phase: str, value: Any) -> None:
        self.data.setdefault("phases", {})[phase] = {"run": self.run, **value}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1, sort_keys=True, default=str) + "\n")


def machine() -> dict[str, Any]:
    with superuser("postgres") as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        buffers = conn.execute("SHOW shared_buffers").fetchone()[0]
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "postgresql": version,
        "shared_buffers": buffers,
        "load_start": load_average(),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                 capture_output=True, text=True).stdout.strip(),
    }


# -- the database ----------------------------------------------------------------


def setup_database() -> None:
    """Drop and create the bench's database, migrated as the tests do."""
    from tests.dbsetup import recreate_database

    connections.close_all()
    recreate_database()
    if statements_on():
        with superuser() as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def drop_database() -> None:
    connections.close_all()
    name = settings.DATABASES["default"]["NAME"]
    with superuser("postgres") as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def services(*args: str) -> None:
    """``scripts/services ARGS``, then this process's environment from its env file."""
    subprocess.run([str(ROOT / "scripts" / "services"), *args], check=True,
                   stdout=subprocess.DEVNULL)
    for line in (ROOT / ".run" / "env").read_text().splitlines():
        found = re.match(r"export (.*)", line)
        for pair in (found.group(1).split() if found else []):
            name, _, value = pair.partition("=")
            os.environ[name] = value


_STATEMENTS: dict[str, bool] = {}


def statements_on() -> bool:
    return _STATEMENTS.get("on", False)


def load_statement_stats(wanted: bool) -> None:
    """Load pg_stat_statements in the private cluster (a restart), for this run only.

    ``ALTER SYSTEM`` adds it to ``shared_preload_libraries`` and the cluster
    restarts (``scripts/services``); :func:`unload_statement_stats` takes the
    setting back at the end, effective at the cluster's next start.
    """
    if not wanted:
        return
    with superuser("postgres") as conn:
        loaded = "pg_stat_statements" in conn.execute(
            "SHOW shared_preload_libraries").fetchone()[0]
        if not loaded:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    if not loaded:
        log("restarting the private PostgreSQL with pg_stat_statements loaded (this run only)")
        pooled = bool(os.environ.get("DIO_PGBOUNCER_PORT"))
        connections.close_all()
        services("stop", "pg")
        services("start", "pg", *(["pgbouncer"] if pooled else []))
        _STATEMENTS["restarted"] = True
    _STATEMENTS["on"] = True


def unload_statement_stats() -> None:
    if _STATEMENTS.get("restarted"):
        with superuser("postgres") as conn:
            conn.execute("ALTER SYSTEM RESET shared_preload_libraries")


def reset_statements() -> None:
    if statements_on():
        with superuser() as conn:
            conn.execute("SELECT pg_stat_statements_reset()")


def top_statements(limit: int = 6) -> list[dict[str, Any]]:
    """The statements that took most of the server's time since :func:`reset_statements`."""
    if not statements_on():
        return []
    with superuser() as conn:
        rows = conn.execute(
            "SELECT regexp_replace(regexp_replace(left(query, 300), '\\s+', ' ', 'g'),"
            "                      '^PREPARE (\\w+) \\([^)]*\\) AS ', '[\\1] '), calls,"
            "       total_exec_time, mean_exec_time, shared_blks_hit, shared_blks_read,"
            "       shared_blks_dirtied, wal_bytes"
            "  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = current_database() AND calls > 0"
            " ORDER BY total_exec_time DESC LIMIT %s", [limit]).fetchall()
    return [
        {"query": q, "calls": calls, "total_ms": round(total, 1), "mean_ms": round(mean, 4),
         "hit_per_call": round(hit / calls, 1), "read_per_call": round(read / calls, 2),
         "dirtied_per_call": round(dirtied / calls, 2), "wal_per_call": round(float(wal) / calls)}
        for q, calls, total, mean, hit, read, dirtied, wal in rows
    ]


def print_statements(rows: list[dict[str, Any]], limit: int = 4) -> None:
    for row in rows[:limit]:
        log(f"      {row['mean_ms']:8.3f} ms x {row['calls']:>7,}  hit {row['hit_per_call']:6.1f}"
            f" read {row['read_per_call']:5.2f}  {row['query'][:90]}")


def sizes(table: str, *, count: bool = False) -> dict[str, Any]:
    """The table's heap and each index, in bytes, with the statistics collector's counts
    (estimates: ``count`` adds the exact number of rows)."""
    with superuser() as conn:
        rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] if count else None
        heap = conn.execute("SELECT pg_relation_size(%s::regclass)", [table]).fetchone()[0]
        indexes = dict(conn.execute(
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index"
            " WHERE indrelid = %s::regclass ORDER BY 1", [table]).fetchall())
        stats = conn.execute(
            "SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count"
            "  FROM pg_stat_user_tables WHERE relid = %s::regclass", [table]).fetchone()
    return {"heap": heap, "indexes": indexes, "live": stats[0], "dead": stats[1],
            "autovacuums": stats[2], "autoanalyzes": stats[3],
            **({"rows": rows} if count else {})}


def mb(value: float) -> str:
    return f"{value / 2**20:,.0f} MB" if value >= 2**20 else f"{value / 1024:,.0f} kB"


# -- seeding ---------------------------------------------------------------------


def key_of(prefix: str, number: int) -> str:
    """The key seeded for ``number``: ``md5(prefix || number)`` as a UUID, as SQL writes it."""
    return str(uuid.UUID(hashlib.md5(f"{prefix}{number}".encode()).hexdigest()))


def tenant_of(number: int, tenants: int) -> int:
    return number % tenants + 1


def make_templates(tenants: int) -> None:
    """One real keyed request per tenant, kept as that tenant's template row.

    The seeded rows copy their template's fingerprint, scope and answer, so a
    replay of a seeded key is answered from the table like any other replay.
    """
    from django.test import Client

    client = Client()
    for tenant in range(1, tenants + 1):
        response = client.post(SCOPE_PATH, BODY, content_type="application/json",
                               HTTP_X_USER=f"t{tenant}", HTTP_IDEMPOTENCY_KEY="scale-template")
        assert response.status_code == 201, response.content
    connections.close_all()
    with superuser() as conn:
        conn.execute("DROP TABLE IF EXISTS scale_key_templates")
        conn.execute("CREATE TABLE scale_key_templates AS SELECT * FROM idempotency_keys"
                     " WHERE key = 'scale-template'")


@contextlib.contextmanager
def without_indexes(conn: psycopg.Connection, table: str) -> Iterator[None]:
    """Drop ``table``'s indexes (and the constraints they back) and build them again after."""
    rows = conn.execute(
        "SELECT c.conname, pg_get_constraintdef(c.oid), i.indexrelid::regclass::text,"
        "       pg_get_indexdef(i.indexrelid)"
        "  FROM pg_index AS i LEFT JOIN pg_constraint AS c ON c.conindid = i.indexrelid"
        "       AND c.conrelid = i.indrelid"
        " WHERE i.indrelid = %s::regclass", [table]).fetchall()
    for constraint, _, index, _ in rows:
        if constraint:
            conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{constraint}"')
        else:
            conn.execute(f"DROP INDEX {index}")
    try:
        yield
    finally:
        conn.execute("SET maintenance_work_mem = '1GB'")
        for constraint, definition, _, index_definition in rows:
            if constraint:
                conn.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{constraint}" {definition}')
            else:
                conn.execute(index_definition)


def seed_keys(first: int, last: int, *, prefix: str, created: str, ttl: str,
              tenants: int) -> float:
    """Insert keys ``first``..``last`` (each its tenant's template with a key of its own).

    ``created`` is an SQL expression of ``g`` (the row's number) for its
    ``created_at``; ``expires_at`` is that plus ``ttl`` (an SQL interval).
    Rows go in the order of ``g``, tenants interleaved, as time would write them.
    """
    started = time.perf_counter()
    if last < first:
        return 0.0
    with superuser() as conn:
        columns = [row[0] for row in conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'idempotency_keys' ORDER BY ordinal_position").fetchall()]
        override = {
            "key": f"md5('{prefix}' || g)::uuid::text",
            "created_at": "c.at",
            "completed_at": "c.at",
            "updated_at": "c.at",
            "expires_at": f"c.at + {ttl}",
        }
        values = ", ".join(override.get(c, f"t.{c}") for c in columns)
        insert = (
            f"INSERT INTO idempotency_keys ({', '.join(columns)})"
            f" SELECT {values}"
            "   FROM generate_series(%s::bigint, %s::bigint) AS g"
            f"  CROSS JOIN LATERAL (SELECT {created} AS at) AS c"
            "   JOIN scale_key_templates AS t ON t.tenant_id = g %% %s + 1"
            "  ORDER BY g"
        )
        conn.execute("SET synchronous_commit = off")
        fast = last - first + 1 > FAST_SEED
        with without_indexes(conn, "idempotency_keys") if fast else contextlib.nullcontext():
            for start in range(first, last + 1, CHUNK):
                conn.execute(insert, [start, min(start + CHUNK - 1, last), tenants])
        conn.execute("VACUUM ANALYZE idempotency_keys")
        conn.execute("CHECKPOINT")
    return time.perf_counter() - started


# -- wrk -------------------------------------------------------------------------

LUA_HEAD = f"""
wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
local threads, all = 0, {{}}
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
  all[threads] = thread
end
-- each answer wrk counts as failed (4xx, 5xx): "<status> <first 200 characters of its body>",
-- at most 5 a thread
bad, bad_count = "", 0
function response(status, headers, body)
  if status > 399 and bad_count < 5 then
    bad_count = bad_count + 1
    bad = bad .. "\\nBAD " .. status .. " " .. string.sub(body or "", 1, 200):gsub("%s+", " ")
  end
end
local tenants, think, keys = 1000, 0, {{}}
local function uuid4()
  local r = math.random
  return string.format("%04x%04x-%04x-4%03x-%04x-%04x%04x%04x", r(0, 65535), r(0, 65535),
    r(0, 65535), r(0, 4095), r(32768, 49151), r(0, 65535), r(0, 65535), r(0, 65535))
end
-- args: seed, tenants, think (ms), replay file ("-": none)
function init(args)
  math.randomseed(tonumber(args[1]) * 7919 + tid)
  tenants = tonumber(args[2])
  think = tonumber(args[3])
  if args[4] ~= "-" then
    for line in io.lines(args[4]) do
      local user, key = line:match("(%S+) (%S+)")
      keys[#keys + 1] = {{user, key}}
    end
  end
end
local function new_key()
  wrk.headers["X-User"] = "t" .. math.random(tenants)
  wrk.headers["Idempotency-Key"] = uuid4()
  return wrk.format()
end
local function replay()
  local pick = keys[math.random(#keys)]
  wrk.headers["X-User"] = pick[1]
  wrk.headers["Idempotency-Key"] = pick[2]
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
  for _, thread in ipairs(all) do
    io.write(thread:get("bad") or "")
  end
  io.write("\\n")
end
"""

LUA = {
    "new": LUA_HEAD + "request = new_key\n",
    "replay": LUA_HEAD + "request = replay\n",
    "mixed": LUA_HEAD + """
local n = 0
function request()
  n = n + 1
  if n % 2 == 0 then return replay() end
  return new_key()
end
""",
}

RESULT = re.compile(r"RESULT requests=(\d+) non2xx=(\d+) errors=(\d+) p50=(\d+) p90=(\d+)"
                    r" p99=(\d+) max=(\d+)")


def script_file(kind: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(LUA[kind])
    return handle.name


def wrk_args(wrk: str, url: str, script: str, connections_: int, seconds: float, seed: int,
             tenants: int, think_ms: int, replays: str) -> list[str]:
    return [wrk, "-t", "2", "-c", str(connections_), "-d", f"{max(1, round(seconds))}s",
            "--timeout", "10s", "--latency", "-s", script, url, "--",
            str(seed), str(tenants), str(think_ms), replays]


def parse_wrk(out: str, seconds: float) -> dict[str, float]:
    found = RESULT.search(out)
    if not found:
        sys.exit(f"bench: wrk gave no result\n{out}")
    requests, non2xx, errors, p50, p90, p99, worst = (int(x) for x in found.groups())
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    return {"rate": float(rate.group(1)) if rate else requests / seconds, "requests": requests,
            "non2xx": non2xx, "errors": errors, "p50": p50 / 1000, "p90": p90 / 1000,
            "p99": p99 / 1000, "max": worst / 1000,
            "bad": re.findall(r"^BAD (.*)$", out, re.M)}


_SEED = iter(range(1, 10**9))


def run_wrk(wrk: str, url: str, kind: str, *, connections_: int, seconds: float, tenants: int,
            replays: str = "-", think_ms: int = 0, server: int | None = None,
            allow_errors: bool = False) -> dict[str, float]:
    """One wrk run of ``kind`` (new, replay, mixed): rate, latency, errors, CPU per request."""
    script = script_file(kind)
    workers = children(server) if server else []
    master = postmaster_pid()
    backends = [master, *children(master)] if master else []
    web0, db0 = cpu_seconds(workers), cpu_seconds(backends)
    try:
        out = subprocess.run(
            wrk_args(wrk, url, script, connections_, seconds, next(_SEED), tenants, think_ms,
                     replays),
            capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(script)
    web1, db1 = cpu_seconds(workers), cpu_seconds(backends)
    result = parse_wrk(out, seconds)
    for answer in result.pop("bad"):
        log(f"    failed ({kind}): {answer}")
    if (result["non2xx"] or result["errors"]) and not allow_errors:
        sys.exit(f"bench: {result['non2xx']:.0f} answers were not 2xx, {result['errors']:.0f} "
                 f"socket errors ({kind} on {url})\n{out}")
    per = 1000 / max(result["requests"], 1)
    result["web_ms"] = (web1 - web0) * per if workers else float("nan")
    result["db_ms"] = (db1 - db0) * per if backends else float("nan")
    return result


class ScaleTraffic(Traffic):
    """bench_reaper's paced traffic (half new keys, half replays), over many tenants."""

    def __init__(self, wrk: str, url: str, connections_: int, think_ms: int, tenants: int,
                 replays: str) -> None:
        self.wrk, self.url = wrk, url
        self.connections, self.think_ms = connections_, think_ms
        self.tenants, self.replays = tenants, replays
        self.script = script_file("mixed")
        self.rounds = 0

    def start(self, seconds: int) -> subprocess.Popen[str]:
        self.rounds += 1
        return subprocess.Popen(
            wrk_args(self.wrk, self.url, self.script, self.connections, seconds, next(_SEED),
                     self.tenants, self.think_ms, self.replays),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def replay_file(count: int, total: int, tenants: int, prefix: str = "k") -> str:
    """``count`` seeded keys of ``1..total``, picked at random: ``t<tenant> <key>`` per line."""
    picks = random.Random(total).sample(range(1, total + 1), min(count, total))
    with tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False) as handle:
        for number in picks:
            handle.write(f"t{tenant_of(number, tenants)} {key_of(prefix, number)}\n")
    return handle.name


def lookup_buffers(total: int, tenants: int) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of a key lookup by the primary key, as the superuser."""
    number = random.Random(7).randint(1, total)
    with superuser() as conn:
        plan = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM idempotency_keys"
            " WHERE tenant_id = %s AND scope = 'order.create' AND key = %s",
            [tenant_of(number, tenants), key_of("k", number)]).fetchone()[0][0]
    top = plan["Plan"]
    return {"node": top["Node Type"], "index": top.get("Index Name"),
            "buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
            "ms": plan["Execution Time"]}


# -- keys ------------------------------------------------------------------------


def phase_keys(args: argparse.Namespace, results: Results, wrk: str) -> None:
    log(f"\n== keys: new key and replay with {', '.join(f'{s:,}' for s in args.key_sizes)} "
        f"rows over {args.tenants:,} tenants")
    setup_database()
    make_templates(args.tenants)
    port = free_port()
    server = start_server(port, args.workers, {**os.environ})
    url = f"http://127.0.0.1:{port}{SCOPE_PATH}"
    points: list[dict[str, Any]] = []
    seeded = 0
    try:
        for size in args.key_sizes:
            took = seed_keys(seeded + 1, size, prefix="k", created=key_time(args), ttl="'1 day'",
                             tenants=args.tenants)
            log(f"  seeded {size - seeded:,} keys in {took:.1f} s")
            seeded = size
            replays = replay_file(20_000, size, args.tenants)
            try:
                for kind in ("new", "replay"):  # warm-up: every worker, the caches
                    run_wrk(wrk, url, kind, connections_=args.connections, seconds=2,
                            tenants=args.tenants, replays=replays)
                reset_statements()
                runs: dict[str, list[dict[str, float]]] = {"new": [], "replay": []}
                for r in range(args.rounds):
                    for kind in (("new", "replay") if r % 2 == 0 else ("replay", "new")):
                        runs[kind].append(run_wrk(
                            wrk, url, kind, connections_=args.connections, seconds=args.seconds,
                            tenants=args.tenants, replays=replays, server=server.pid))
            finally:
                os.unlink(replays)
            point = {"rows": size, "tenants": args.tenants, "sizes": sizes("idempotency_keys"),
                     "lookup": lookup_buffers(size, args.tenants),
                     "statements": top_statements(), "load": load_average()}
            for kind, values in runs.items():
                point[kind] = {k: statistics.median(v[k] for v in values) for k in values[0]}
                point[kind]["rates"] = [v["rate"] for v in values]
            points.append(point)
            log(f"  {size:>11,} rows: new key {point['new']['rate']:7.0f}/s p50 "
                f"{point['new']['p50']:5.1f} p99 {point['new']['p99']:6.1f} ms | replay "
                f"{point['replay']['rate']:7.0f}/s p50 {point['replay']['p50']:5.1f} p99 "
                f"{point['replay']['p99']:6.1f} ms | CPU/request new "
                f"{cpu_of(point['new']):.2f} ms, replay {cpu_of(point['replay']):.2f} ms | heap "
                f"{mb(point['sizes']['heap'])}, lookup {point['lookup']['buffers']} buffers "
                f"(load {point['load']})")
            print_statements(point["statements"])
    finally:
        server.terminate()
        server.wait(10)
    first, last = points[0], points[-1]
    summary = {kind: last[kind]["rate"] / first[kind]["rate"] for kind in ("new", "replay")}
    by_cpu = {kind: cpu_of(first[kind]) / cpu_of(last[kind]) for kind in ("new", "replay")}
    log(f"  {last['rows']:,} rows against {first['rows']:,}: new key x{summary['new']:.2f}, "
        f"replay x{summary['replay']:.2f} requests/s; by CPU per request x{by_cpu['new']:.2f}, "
        f"x{by_cpu['replay']:.2f} (target: within 15 %)")
    results.save("keys", {"points": points, "ratio_last_first": summary, "cpu_ratio": by_cpu,
                          "workers": args.workers, "connections": args.connections,
                          "seconds": args.seconds, "rounds": args.rounds})


def cpu_of(run: dict[str, float]) -> float:
    """CPU ms per request, gunicorn worker and PostgreSQL: steadier than requests/s here."""
    return run["web_ms"] + run["db_ms"]


def key_time(args: argparse.Namespace) -> str:
    """created_at of seeded live key ``g``: spread over the last 23 hours, in ``g`` order."""
    biggest = max(args.key_sizes)
    return f"now() - interval '23 hours' * (1 - g::float8 / {biggest})"


def ensure_keys(args: argparse.Namespace, wanted: int) -> int:
    """The keys phase's table, seeded to ``wanted`` rows if another phase runs without it."""
    if not database_exists():
        setup_database()
    with superuser() as conn:
        exists = conn.execute("SELECT to_regclass('scale_key_templates') IS NOT NULL"
                              ).fetchone()[0]
        have = conn.execute("SELECT count(*) FROM idempotency_keys WHERE key <> 'scale-template'"
                            ).fetchone()[0] if exists else 0
    if exists and have >= wanted:
        return int(have)
    if not exists:
        setup_database()
        make_templates(args.tenants)
        have = 0
    took = seed_keys(1, wanted, prefix="k", created=key_time(args), ttl="'1 day'",
                     tenants=args.tenants)
    log(f"  seeded {wanted:,} live keys in {took:.1f} s")
    return wanted


def database_exists() -> bool:
    name = settings.DATABASES["default"]["NAME"]
    with superuser("postgres") as conn:
        return bool(conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
                    .fetchone())


# -- many connections ------------------------------------------------------------


def pgbouncer_admin() -> psycopg.Connection:
    """pgbouncer's admin console (simple query protocol: client-side binding)."""
    owner = settings.DATABASES["owner"]
    return psycopg.connect(host="127.0.0.1", port=os.environ["DIO_PGBOUNCER_PORT"],
                           user=owner["USER"], password=owner["PASSWORD"], dbname="pgbouncer",
                           autocommit=True, cursor_factory=psycopg.ClientCursor)


def pool_figures(admin: psycopg.Connection) -> dict[str, float]:
    """The bench pool's clients waiting and server sessions (pgbouncer's SHOW POOLS)."""
    cursor = admin.execute("SHOW POOLS")
    names = [c.name for c in cursor.description or []]
    name = settings.DATABASES["default"]["NAME"]
    user = settings.DATABASES["default"]["USER"]
    for row in cursor.fetchall():
        pool = dict(zip(names, row, strict=True))
        if pool["database"] == name and pool["user"] == user:
            return {"cl_active": pool["cl_active"], "cl_waiting": pool["cl_waiting"],
                    "sv_active": pool["sv_active"], "sv_idle": pool["sv_idle"],
                    "sv_used": pool["sv_used"],
                    "maxwait_ms": pool["maxwait"] * 1000 + pool["maxwait_us"] / 1000}
    return {}


def phase_pooled(args: argparse.Namespace, results: Results, wrk: str) -> None:
    log(f"\n== many connections: {args.clients} client connections through pgbouncer "
        f"(transaction mode) to {args.server_sessions} server sessions")
    if not os.environ.get("DIO_PGBOUNCER_PORT"):
        log("  skipped: no pgbouncer (make bench-scale starts one: scripts/services ... pgbouncer)")
        return
    total = ensure_keys(args, max(args.key_sizes))
    replays = replay_file(20_000, total, args.tenants)
    workers = args.workers
    runs: dict[str, Any] = {}
    try:
        with pgbouncer_admin() as admin:
            before = {row[0]: row[1] for row in admin.execute("SHOW CONFIG").fetchall()}
            admin.execute(f"SET default_pool_size = {int(args.server_sessions)}")
            try:
                for label, pooled, threads in (
                    ("pgbouncer", True, args.clients // workers),
                    ("direct", False, args.server_sessions // workers),
                ):
                    runs[label] = pooled_run(args, wrk, replays, pooled, workers, threads)
            finally:
                admin.execute(f"SET default_pool_size = {int(before['default_pool_size'])}")
    finally:
        os.unlink(replays)
    for label, r in runs.items():
        log(f"  {label:<9} {r['db_clients']:>3} database clients, {r['server_sessions']:>3} server "
            f"sessions: {r['rate']:6.0f} requests/s, p50 {r['p50']:6.1f} ms, p99 "
            f"{r['p99']:7.1f} ms, max {r['max']:7.1f} ms; {r['non2xx']:.0f} non-2xx, "
            f"{r['errors']:.0f} socket errors of {r['requests']:,.0f}"
            + (f"; clients waiting for a server at most {r['pool'].get('cl_waiting_max', 0):.0f},"
               f" longest wait {r['pool'].get('maxwait_ms_max', 0):.0f} ms" if r.get("pool")
               else ""))
    results.save("pooled", {"runs": runs, "clients": args.clients,
                            "server_sessions": args.server_sessions,
                            "seconds": args.pooled_seconds, "rows": total})


def pooled_run(args: argparse.Namespace, wrk: str, replays: str, pooled: bool, workers: int,
               threads: int) -> dict[str, Any]:
    """gunicorn (gthread), ``workers`` x ``threads`` database clients; wrk, ``--clients``."""
    saved = os.environ.get("DIO_POOLED")
    if pooled:
        os.environ["DIO_POOLED"] = "app"
    server = LiveServer(workers=workers, threads=threads, timeout=60)
    try:
        server.start()
    finally:
        if saved is None:
            os.environ.pop("DIO_POOLED", None)
        else:
            os.environ["DIO_POOLED"] = saved
    samples: list[dict[str, float]] = []
    done = threading.Event()

    def sample() -> None:
        if not pooled:
            return
        with pgbouncer_admin() as admin:
            while not done.wait(0.5):
                samples.append(pool_figures(admin))

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        url = server.url + SCOPE_PATH
        run_wrk(wrk, url, "mixed", connections_=args.clients, seconds=3, tenants=args.tenants,
                replays=replays, allow_errors=True)  # warm-up: every thread's connection
        sampler.start()
        result: dict[str, Any] = run_wrk(
            wrk, url, "mixed", connections_=args.clients, seconds=args.pooled_seconds,
            tenants=args.tenants, replays=replays, server=server.proc.pid if server.proc else None,
            allow_errors=True)
        done.set()
        sampler.join(5)
    finally:
        done.set()
        server.stop()
    result["db_clients"] = workers * threads
    # Direct, each client is a server session; pooled, what pgbouncer opened at most.
    result["server_sessions"] = workers * threads
    if samples:
        result["server_sessions"] = max(
            s.get("sv_active", 0) + s.get("sv_idle", 0) + s.get("sv_used", 0) for s in samples)
        result["pool"] = {
            "cl_waiting_max": max(s.get("cl_waiting", 0) for s in samples),
            "maxwait_ms_max": max(s.get("maxwait_ms", 0) for s in samples),
            "sv_active_max": max(s.get("sv_active", 0) for s in samples),
        }
    result["error_rate"] = (result["non2xx"] + result["errors"]) / max(result["requests"], 1)
    return result


# -- reaper and churn ------------------------------------------------------------


def phase_reaper(args: argparse.Namespace, results: Results, wrk: str) -> None:
    log(f"\n== reaper: {args.reap_keys:,} expired keys reaped under live traffic")
    live = ensure_keys(args, max(args.key_sizes))
    took = seed_keys(
        1, args.reap_keys, prefix="x", tenants=args.tenants, ttl="'1 day'",
        created=f"now() - interval '2 days' + interval '23 hours' * g::float8 / {args.reap_keys}")
    log(f"  seeded {args.reap_keys:,} expired keys beside {live:,} live ones in {took:.1f} s")
    before_sizes = sizes("idempotency_keys")
    port = free_port()
    server = start_server(port, args.workers, {**os.environ})
    replays = replay_file(20_000, live, args.tenants)
    traffic = ScaleTraffic(wrk, f"http://127.0.0.1:{port}{SCOPE_PATH}", 8, 20, args.tenants,
                           replays)
    try:
        traffic.run(3)  # warm-up
        reset_statements()
        before = traffic.run(args.traffic_seconds)
        log(f"  without reaping: {before['rate']:.0f} requests/s, p50 {before['p50']:.1f} ms, "
            f"p99 {before['p99']:.1f} ms")
        report, during = reap_under(traffic, None, None, False)
        log(f"  while reaping:   {during['rate']:.0f} requests/s, p50 {during['p50']:.1f} ms, "
            f"p99 {during['p99']:.1f} ms")
        after = traffic.run(args.traffic_seconds)
        log(f"  without reaping: {after['rate']:.0f} requests/s, p50 {after['p50']:.1f} ms, "
            f"p99 {after['p99']:.1f} ms")
        statements = top_statements()
    finally:
        traffic.close()
        os.unlink(replays)
        server.terminate()
        server.wait(10)
    reaped = sizes("idempotency_keys", count=True)
    with superuser() as conn:
        conn.execute("VACUUM idempotency_keys")
    vacuumed = sizes("idempotency_keys", count=True)
    gaps = [g * 1000 for g in report.pop("gaps")]
    baseline = (before["p99"] + after["p99"]) / 2
    value = {
        "keys": args.reap_keys, "live": live, "report": report,
        "rate": report["deleted"] / max(report["seconds"], 1e-9),
        "batch_p50_ms": statistics.median(gaps) if gaps else 0.0,
        "batch_p99_ms": percentile(gaps, 0.99),
        "before": before, "during": during, "after": after, "p99_ratio": during["p99"] / baseline,
        "sizes": {"seeded": before_sizes, "reaped": reaped, "vacuumed": vacuumed},
        "statements": statements,
    }
    log(f"  deleted {report['deleted']:,} in {report['seconds']:.1f} s ({value['rate']:,.0f} "
        f"keys/s), longest batch {report['longest_batch_seconds'] * 1000:.1f} ms; live p99 "
        f"{baseline:.1f} ms without, {during['p99']:.1f} ms with: x{value['p99_ratio']:.2f} "
        "(target <= 1.10)")
    for label, s in value["sizes"].items():
        log(f"  {label:<9} heap {mb(s['heap']):>9}, indexes "
            + ", ".join(f"{name} {mb(size)}" for name, size in s["indexes"].items())
            + f"; {s['live']:,} live, {s['dead']:,} dead rows")
    print_statements(statements)
    results.save("reaper", value)


def phase_churn(args: argparse.Namespace, results: Results) -> None:
    from idempotency.reaper import reap_expired_keys

    steps, step_s = args.churn_steps, args.churn_step_seconds
    day = steps * step_s
    log(f"\n== churn: a day of keys compressed into {steps} steps of {step_s:g} s, "
        f"{args.churn_keys:,} live keys")
    if not database_exists():
        setup_database()
    with superuser() as conn:
        if not conn.execute("SELECT to_regclass('scale_key_templates') IS NOT NULL").fetchone()[0]:
            make_templates(args.tenants)
    variants: dict[str, Any] = {}
    for variant in ("default", "tuned"):
        with superuser() as conn:
            conn.execute("TRUNCATE idempotency_keys")
            if variant == "tuned":
                conn.execute("ALTER TABLE idempotency_keys SET ("
                             + ", ".join(f"{k} = {v}" for k, v in TUNED_AUTOVACUUM.items())
                             + ")")
            else:
                conn.execute("ALTER TABLE idempotency_keys RESET ("
                             + ", ".join(TUNED_AUTOVACUUM) + ")")
        n = args.churn_keys
        # The day's keys, expiring evenly over the compressed day from now on.
        seed_keys(1, n, prefix="c", tenants=args.tenants, ttl=f"interval '{day} seconds'",
                  created=f"now() - interval '{day} seconds' * (1 - g::float8 / {n})")
        base = sizes("idempotency_keys", count=True)
        vacuums = base["autovacuums"]  # the statistics outlive TRUNCATE
        base["autovacuums"] = 0
        samples = [{"step": 0, "t": 0.0, **base}]
        started = time.monotonic()
        per_step = n // steps
        with superuser() as conn:
            insert_new = conn.execute(
                "SELECT string_agg(CASE column_name"
                " WHEN 'key' THEN 'md5(random()::text || g)::uuid::text'"
                " WHEN 'created_at' THEN 'now()' WHEN 'completed_at' THEN 'now()'"
                " WHEN 'updated_at' THEN 'now()'"
                f" WHEN 'expires_at' THEN 'now() + interval ''{day} seconds'''"
                " ELSE 't.' || column_name END, ', ' ORDER BY ordinal_position),"
                " string_agg(column_name, ', ' ORDER BY ordinal_position)"
                " FROM information_schema.columns WHERE table_name = 'idempotency_keys'"
            ).fetchone()
        insert = (f"INSERT INTO idempotency_keys ({insert_new[1]}) SELECT {insert_new[0]}"
                  " FROM generate_series(1, %s) AS g"
                  " JOIN scale_key_templates AS t ON t.tenant_id = (g::bigint * 7919) %% %s + 1")
        for step in range(1, steps + 1):
            with superuser() as conn:
                conn.execute(insert, [per_step, args.tenants])
            # Flat out (1,000 rows a batch, no pause): the churn measures what the
            # deletes leave behind, not the reaper's footprint (the reaper phase does).
            report = reap_expired_keys(batch_size=1000, pause=0)
            connections.close_all()
            elapsed = time.monotonic() - started
            if elapsed > step * step_s + step_s / 2:
                log(f"  (step {step} ended {elapsed - step * step_s:.0f} s late: the day is "
                    "longer than planned; raise --churn-step-seconds)")
            samples.append({"step": step, "t": elapsed, "reaped": report.deleted,
                            "reap_seconds": report.seconds,
                            **sizes("idempotency_keys", count=True)})
            s = samples[-1]
            s["autovacuums"] -= vacuums
            log(f"  {variant:<7} step {step:>2}/{steps}: +{per_step:,} -{report.deleted:,} keys; "
                f"heap {mb(s['heap'])}, indexes "
                + ", ".join(mb(v) for v in s["indexes"].values())
                + f"; {s['rows']:,} rows, {s['dead']:,} dead (estimated), "
                f"{s['autovacuums']} autovacuums; reaped in {report.seconds:.1f} s")
            pause = started + step * step_s - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        variants[variant] = {"samples": samples,
                             "settings": TUNED_AUTOVACUUM if variant == "tuned" else {}}
    with superuser() as conn:
        conn.execute("ALTER TABLE idempotency_keys RESET (" + ", ".join(TUNED_AUTOVACUUM) + ")")
        naptime = conn.execute("SHOW autovacuum_naptime").fetchone()[0]
    results.save("churn", {"variants": variants, "keys": args.churn_keys, "steps": steps,
                           "step_seconds": step_s, "naptime": naptime})


# -- outbox ----------------------------------------------------------------------


def outbox_reset() -> None:
    """Empty the outbox, the offsets and the bench's queue (bench_outbox.reset)."""
    connections.close_all()
    bench_outbox.reset()


def insert_backlog(count: int, tenants: int, *, stamp: bool = False,
                   chunk: int = 50_000) -> float:
    """``count`` messages over ``tenants`` tenants, interleaved (through the trigger)."""
    started = time.perf_counter()
    payload = ("jsonb_build_object('n', g, 'sku', 'sku-' || g, 'quantity', 1"
               + (", 't', extract(epoch FROM clock_timestamp()))" if stamp else ")"))
    with superuser() as conn:
        for first in range(0, count, chunk):
            n = min(chunk, count - first)
            conn.execute(
                "INSERT INTO outbox_messages (tenant_id, message_id, topic, key, payload)"
                " SELECT (g %% %s) + 1, gen_random_uuid(), 'scale.backlog',"
                f"        'order:' || (g %% 5000), {payload}"
                "   FROM generate_series(%s::bigint, %s::bigint) AS g",
                [tenants, first, first + n - 1])
        conn.execute("VACUUM ANALYZE outbox_messages")
    bench_outbox.wait_for_fence(300)
    return time.perf_counter() - started


class Publishers:
    """``threads`` threads publishing one message per transaction at ``rate`` messages/s in
    all, each to a random tenant of ``tenants``, holding its transaction ``hold`` seconds
    after the INSERT (a request's remaining work); each message's commit time is kept."""

    def __init__(self, threads: int, rate: float, tenants: int, hold: float = 0.0,
                 topic: str = "scale.live") -> None:
        self.rate, self.tenants, self.hold, self.topic = rate, tenants, hold, topic
        self.stop = threading.Event()
        self.committed: dict[str, float] = {}
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i, threads), daemon=True)
                        for i in range(threads)]

    def __enter__(self) -> Publishers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _run(self, index: int, count: int) -> None:
        pick = random.Random(index)
        every = count / self.rate
        due = time.monotonic() + every * index / count
        n = index
        try:
            while not self.stop.is_set():
                pause = due - time.monotonic()
                if pause > 0:
                    self.stop.wait(pause)
                due += every
                tenant = pick.randint(1, self.tenants)
                with tenant_context(tenant), transaction.atomic():
                    message_id = publish(self.topic, {"n": n, "t": time.time()},
                                         key=f"order:{n}")
                    if self.hold:
                        time.sleep(self.hold)
                self.committed[str(message_id)] = time.perf_counter()
                n += count
        except Exception as exc:  # noqa: BLE001 - reported by the phase
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            connections.close_all()


def start_process(args: list[str], log_path: Path | None = None,
                  env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``manage.py ARGS`` with the bench's settings, in a process of its own."""
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, "manage.py", *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, **(env or {})})


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for_lease(name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with superuser() as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT lease_owner FROM consumer_offsets WHERE name = %s"
                               " AND lease_until > now()", [f"relay:{name}"]).fetchone()
            if row and row[0]:
                return
            time.sleep(0.05)
    sys.exit(f"bench: relay {name} did not take its lease")


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Drain(threading.Thread):
    """Empties the bench's Redis queue every ``every`` seconds, counting what it took.

    ``LLEN`` and ``DEL`` in one MULTI: nothing pushed between them is lost to the count.
    Survives the broker being down (it counts nothing meanwhile).
    """

    def __init__(self, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.every = every
        self.count = 0
        self.marks: list[tuple[float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        client = bench_outbox.broker()
        queue = bench_outbox.QUEUE
        while not self.done.wait(self.every):
            try:
                with client.pipeline(transaction=True) as pipe:
                    pipe.llen(queue)
                    pipe.delete(queue)
                    taken, _ = pipe.execute()
            except redis.RedisError:
                continue
            self.count += int(taken)
            self.marks.append((time.monotonic(), self.count))

    def stop(self) -> None:
        self.done.set()
        self.join(10)


def latencies_of(arrivals: bench_outbox.Arrivals, committed: dict[str, float]) -> list[float]:
    return sorted((arrivals.times[m][0] - t) * 1000 for m, t in committed.items()
                  if m in arrivals.times)


def phase_tenants(args: argparse.Namespace, results: Results) -> None:
    log(f"\n== tenants: the relay with {', '.join(f'{t:,}' for t in args.outbox_tenants)} "
        "tenants publishing")
    if not database_exists():
        setup_database()
    points = []
    for tenants in args.outbox_tenants:
        point: dict[str, Any] = {"tenants": tenants}
        # Throughput: a backlog over the tenants, drained while publishers of the same
        # tenants keep transactions in flight (their marks are what the reads pass).
        outbox_reset()
        insert_backlog(args.tenant_backlog, tenants)
        warm = Relay(name=f"scale-warm-{tenants}")
        warm.drain()
        warm.release()
        warm.transport.close()
        outbox_reset()
        insert_backlog(args.tenant_backlog, tenants)
        reset_statements()
        relay = Relay(name=f"scale-{tenants}")
        drain = Drain()
        drain.start()
        with Publishers(args.publishers, args.rate, tenants, hold=0.02) as publishers:
            time.sleep(0.5)  # publishers in flight
            started, cpu = time.perf_counter(), time.process_time()
            sent = relay.drain()
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        relay.release()
        relay.transport.close()
        drain.stop()
        point["throughput"] = sent / elapsed
        point["relay_cpu_us"] = cpu / max(sent, 1) * 1e6
        point["statements"] = top_statements()
        if publishers.errors:
            point["publisher_errors"] = publishers.errors[:3]
        # Latency: relay_outbox at a steady rate.
        outbox_reset()
        relay_proc = start_process(["relay_outbox", "--name", f"scale-lat-{tenants}"])
        arrivals = bench_outbox.Arrivals()
        arrivals.start()
        try:
            wait_for_lease(f"scale-lat-{tenants}")
            with Publishers(args.publishers, args.rate, tenants) as publishers:
                time.sleep(args.latency_seconds)
            deadline = time.monotonic() + 30
            while (len(set(publishers.committed) & arrivals.times.keys())
                   < len(publishers.committed) and time.monotonic() < deadline):
                time.sleep(0.05)
        finally:
            stop_process(relay_proc)
            arrivals.stop()
        latencies = latencies_of(arrivals, publishers.committed)
        point["latency"] = {
            "messages": len(publishers.committed), "delivered": len(latencies),
            "p50": statistics.median(latencies) if latencies else float("nan"),
            "p99": percentile(latencies, 0.99), "max": latencies[-1] if latencies else 0.0,
        }
        point["one_transaction"] = one_transaction_for_all(tenants)
        points.append(point)
        lat, one = point["latency"], point["one_transaction"]
        log(f"  {tenants:>6,} tenants: relay {point['throughput']:8,.0f} messages/s "
            f"({point['relay_cpu_us']:.0f} µs relay CPU each); commit->broker p50 "
            f"{lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms ({lat['delivered']:,} of "
            f"{lat['messages']:,} at {args.rate:g}/s); one transaction for all {tenants:,} "
            f"tenants: {one['summary']}")
        print_statements(point["statements"])
    locks = tenants_per_transaction()
    log("  one transaction publishing for N tenants (max_locks_per_transaction "
        f"{locks['max_locks_per_transaction']}): "
        + ", ".join(f"{k:,}: {v}" for k, v in locks["tried"].items()))
    first, last = points[0], points[-1]
    ratio = last["throughput"] / first["throughput"]
    log(f"  {last['tenants']:,} tenants against {first['tenants']:,}: throughput x{ratio:.2f}, "
        f"p99 {first['latency']['p99']:.1f} -> {last['latency']['p99']:.1f} ms "
        "(target: within 20 %)")
    results.save("tenants", {"points": points, "backlog": args.tenant_backlog,
                             "publishers": args.publishers, "rate": args.rate,
                             "tenants_per_transaction": locks,
                             "ratio_last_first": ratio})


def one_transaction_for_all(tenants: int) -> dict[str, Any]:
    """One transaction publishing a message for each of ``tenants`` tenants, as a consumer
    batch whose handlers publish, or a batch job, would; open while another tenant's message
    passes, so that the relay holds every one of its tenants back meanwhile.

    Its INSERT's time and the advisory locks it holds (against the lock table's slots), the
    relay's round that passes the other message and the round after it (with every tenant
    held), and the drain once it commits.
    """
    outbox_reset()
    out: dict[str, Any] = {}
    relay = Relay(name=f"scale-one-{tenants}")
    with superuser() as observer_conn:
        out["lock_slots"] = observer_conn.execute(
            "SELECT current_setting('max_locks_per_transaction')::int"
            " * (current_setting('max_connections')::int"
            " + current_setting('max_prepared_transactions')::int)").fetchone()[0]
        with superuser() as job:
            job.execute("BEGIN")
            try:
                started = time.perf_counter()
                job.execute(
                    "INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
                    " SELECT g, gen_random_uuid(), 'scale.batch', jsonb_build_object('n', g)"
                    "   FROM generate_series(1, %s) AS g", [tenants])
                out["publish_ms"] = (time.perf_counter() - started) * 1000
            except psycopg.Error as exc:
                job.execute("ROLLBACK")
                out["error"] = str(exc).splitlines()[0]
                out["summary"] = f"FAILED: {out['error']}"
                return out
            out["advisory_locks"] = observer_conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()[0]
            with tenant_context(tenants + 1), transaction.atomic():
                publish("scale.other", {"n": 0})
            started = time.perf_counter()
            relay.drain()
            out["pass_ms"] = (time.perf_counter() - started) * 1000
            out["held"] = observer_conn.execute(
                "SELECT count(*) FROM consumer_offsets, jsonb_object_keys(held)"
                " WHERE name = %s", [f"relay:scale-one-{tenants}"]).fetchone()[0]
            started = time.perf_counter()
            relay.drain()
            out["held_round_ms"] = (time.perf_counter() - started) * 1000
            job.execute("COMMIT")
        started = time.perf_counter()
        out["sent_after"] = relay.drain()
        out["drain_after_ms"] = (time.perf_counter() - started) * 1000
    relay.release()
    relay.transport.close()
    connections.close_all()
    out["summary"] = (
        f"INSERT {out['publish_ms']:.0f} ms, {out['advisory_locks']:,} advisory locks "
        f"({out['lock_slots']:,} lock slots), {out['held']:,} tenants held; relay rounds "
        f"{out['pass_ms']:.0f} ms (passing another tenant), {out['held_round_ms']:.0f} ms "
        f"(all held), {out['drain_after_ms']:.0f} ms (after COMMIT, "
        f"{out['sent_after']:,} sent)")
    return out


def tenants_per_transaction() -> dict[str, Any]:
    """How many tenants one transaction can publish for before the lock table is full.

    Each tenant a transaction writes for is an advisory lock it holds until it
    ends; PostgreSQL's lock table has room for about ``max_locks_per_transaction
    * (max_connections + max_prepared_transactions)`` locks, shared by every
    session. Tried at growing counts (rolled back each time), with nothing
    else running.
    """
    out: dict[str, Any] = {"tried": {}}
    with superuser() as conn:
        out["max_locks_per_transaction"] = int(conn.execute(
            "SHOW max_locks_per_transaction").fetchone()[0])
        for count in (10_000, 20_000, 30_000, 50_000, 100_000):
            conn.execute("BEGIN")
            try:
                conn.execute(
                    "INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
                    " SELECT g, gen_random_uuid(), 'scale.locks', '{}'"
                    "   FROM generate_series(1, %s) AS g", [count])
                out["tried"][count] = "ok"
            except psycopg.Error as exc:
                out["tried"][count] = str(exc).splitlines()[0]
                out["first_failure"] = count
            finally:
                conn.execute("ROLLBACK")
            if "first_failure" in out:
                break
    return out


def observe_lag(reader: str) -> dict[str, Any]:
    """What health and the metrics say about ``reader`` now, and how long each took to ask."""
    from outbox.health import check
    from outbox.metrics import OutboxCollector

    started = time.perf_counter()
    health = check(readers=[reader])
    health_ms = (time.perf_counter() - started) * 1000
    row = next((r for r in health.readers if r.name == reader), None)
    started = time.perf_counter()
    lag_seconds = behind = None
    for family in OutboxCollector().collect():
        for sample in getattr(family, "samples", []):
            if sample.labels.get("reader") != reader:
                continue
            if sample.name == "dio_outbox_lag_seconds":
                lag_seconds = sample.value
            elif sample.name == "dio_outbox_lag_messages":
                behind = sample.value
    metrics_ms = (time.perf_counter() - started) * 1000
    connections.close_all()
    return {
        "health_lag_s": row.lag.total_seconds() if row and row.lag else 0.0,
        "health_behind": row.behind if row else None, "health_ok": health.ok,
        "health_ms": health_ms, "metrics_lag_s": lag_seconds, "metrics_behind": behind,
        "metrics_ms": metrics_ms,
    }


#: How the backlog phase's messages pile up (see :func:`backlog_run`).
BACKLOG_MODES = {
    "outage": "the relay was failing to send when the backlog piled up",
    "bulk": "the backlog was written by transactions of 100 tenants each while the relay "
            "had nothing to send",
}


def read_probe() -> dict[str, float]:
    """One read of 1,000 messages from the middle of the outbox, as the system role, in a
    session of its own (the second of two reads: catalogs cached): its buffers and time."""
    role = settings.DATABASES["system"]["USER"]
    with superuser() as conn:
        middle = conn.execute("SELECT coalesce((min(id) + max(id)) / 2, 0) FROM outbox_messages"
                              ).fetchone()[0]
        conn.execute(f'SET ROLE "{role}"')
        for _ in range(2):
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM"
                " outbox_read_v2(%s, '{}'::jsonb, 1000, NULL, 0, 1)", [middle]).fetchone()[0][0]
    return {"buffers": plan["Plan"].get("Shared Hit Blocks", 0)
            + plan["Plan"].get("Shared Read Blocks", 0), "ms": plan["Execution Time"]}


def phase_backlog(args: argparse.Namespace, results: Results) -> None:
    log(f"\n== backlog: {args.backlog:,} messages piled up while the broker was down, "
        "then drained")
    if not database_exists():
        setup_database()
    modes = {}
    for mode in BACKLOG_MODES:
        modes[mode] = run = backlog_run(args, mode)
        rss = [s["rss_mb"] for s in run["samples"]]
        log(f"  {mode}: the relay resumed {run['resumed_after_s']:.1f} s after the broker was "
            f"back and drained {run['delivered']:,} in {run['drain_s']:.1f} s "
            f"({run['rate']:,.0f}/s); by tenth of the backlog: "
            + ", ".join(f"{r:,.0f}" for r in run["decile_rates"]))
        if rss:
            samples = run["samples"]
            log(f"  {mode}: relay RSS {min(rss):.0f}-{max(rss):.0f} MB; health "
                f"{statistics.median(s['health_ms'] for s in samples):.0f} ms (max "
                f"{max(s['health_ms'] for s in samples):.0f}), metrics "
                f"{statistics.median(s['metrics_ms'] for s in samples):.0f} ms (max "
                f"{max(s['metrics_ms'] for s in samples):.0f}); lag at the start "
                f"{samples[0]['health_lag_s']:.0f} s / {samples[0]['health_behind'] or 0:,} "
                "messages")
        log(f"  {mode}: pages all-visible after the insert {run['all_visible']:.0%}; a read "
            f"of 1,000 from the middle afterwards: {run['read_probe']['buffers']} buffers, "
            f"{run['read_probe']['ms']:.1f} ms")
        print_statements(run["statements"])
    results.save("backlog", {"messages": args.backlog, "outage_s": args.outage_seconds,
                             "modes": modes})


def backlog_run(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """Redis stopped, ``--backlog`` messages inserted, Redis started: the drain, sampled.

    ``outage``: a message is committed first and the relay fails to send it, so
    it stays where it is (a failing send never moves its position) while the
    backlog piles up, as when publishers go on during an outage. ``bulk``: the
    relay has nothing to send while the backlog's transactions (50,000 messages
    of 100 tenants each) are open, so it moves past them holding those
    tenants back, and reads them afterwards through their held positions.
    """
    name = f"scale-backlog-{mode}"
    outbox_reset()
    relay_log = Path(tempfile.mkstemp(prefix="dio-scale-relay.", suffix=".log")[1])
    relay = start_process(["relay_outbox", "--name", name], relay_log)
    drain = Drain()
    samples: list[dict[str, Any]] = []
    try:
        wait_for_lease(name)
        services("stop", "redis")
        down = time.monotonic()
        if mode == "outage":
            with tenant_context(1), transaction.atomic():
                publish("scale.first", {"n": 0})
            deadline = time.monotonic() + 30
            while b"could not send" not in relay_log.read_bytes():
                if time.monotonic() > deadline:
                    sys.exit(f"bench: the relay did not fail\n{relay_log.read_text()[-2000:]}")
                time.sleep(0.05)
        took = insert_backlog(args.backlog, 100)
        with superuser() as conn:
            held = conn.execute("SELECT count(*) FROM consumer_offsets, jsonb_object_keys(held)"
                                " WHERE name = %s", [f"relay:{name}"]).fetchone()[0]
            visible = conn.execute("SELECT relallvisible::float8 / greatest(relpages, 1)"
                                   "  FROM pg_class WHERE oid = 'outbox_messages'::regclass"
                                   ).fetchone()[0]
        log(f"  {mode}: broker down; {args.backlog:,} messages inserted in {took:.1f} s; the "
            f"relay holds {held} tenant(s) back")
        time.sleep(max(0.0, down + args.outage_seconds - time.monotonic()))
        services("start", "redis")
        back = time.monotonic()
        drain.start()
        reset_statements()
        total = args.backlog + (mode == "outage")
        deadline = back + max(600.0, args.backlog / 500)
        while drain.count < total and time.monotonic() < deadline:
            if relay.poll() is not None:
                sys.exit(f"bench: relay_outbox exited\n{relay_log.read_text()[-2000:]}")
            sample = {"t": time.monotonic() - back, "delivered": drain.count,
                      "rss_mb": rss_mb(relay.pid), **observe_lag(f"relay:{name}")}
            samples.append(sample)
            time.sleep(1.0)
        finished = time.monotonic()
        statements = top_statements()
    finally:
        stop_process(relay)
        drain.stop()
    marks = drain.marks
    first = next((t for t, count in marks if count > 0), finished)
    deciles = []
    for k in range(10):
        lo, hi = total * k / 10, total * (k + 1) / 10
        t_lo = next((t for t, c in marks if c >= lo), None)
        t_hi = next((t for t, c in marks if c >= hi), None)
        if t_lo is not None and t_hi is not None and t_hi > t_lo:
            deciles.append((hi - lo) / (t_hi - t_lo))
    run = {
        "held": held, "all_visible": visible, "read_probe": read_probe(),
        "resumed_after_s": first - back, "drain_s": finished - first,
        "rate": drain.count / max(finished - first, 1e-9), "delivered": drain.count,
        "complete": drain.count >= total, "decile_rates": deciles, "samples": samples,
        "marks": [[t - back, c] for t, c in marks[::max(1, len(marks) // 400)]],
        "statements": statements, "relay_log_tail": relay_log.read_text()[-1500:],
    }
    relay_log.unlink(missing_ok=True)
    return run


def phase_retention(args: argparse.Namespace, results: Results) -> None:
    from outbox.retention import reap

    name = "scale-retention"
    rate = args.retention_rate / 3600
    log(f"\n== retention: {args.retention_rate:,} messages/hour ({rate:.0f}/s) for "
        f"{args.retention_duration:g} s, RETENTION {args.retention_seconds:g} s, reap_outbox "
        f"every {args.reap_every:g} s")
    if not database_exists():
        setup_database()
    outbox_reset()
    relay = start_process(["relay_outbox", "--name", name])
    drain = Drain()
    drain.start()
    samples: list[dict[str, Any]] = []
    reaps: list[dict[str, float]] = []
    outbox = {**settings.OUTBOX, "RETENTION": timedelta(seconds=args.retention_seconds)}
    try:
        wait_for_lease(name)
        with override_settings(OUTBOX=outbox), Publishers(4, rate, 100) as publishers:
            started = time.monotonic()
            next_reap = started + args.reap_every
            while time.monotonic() - started < args.retention_duration:
                if time.monotonic() >= next_reap:
                    t0 = time.perf_counter()
                    result = reap()
                    connections.close_all()
                    reaps.append({"t": time.monotonic() - started, "deleted": result.messages,
                                  "seconds": time.perf_counter() - t0})
                    next_reap += args.reap_every
                with superuser() as conn:
                    rows = conn.execute("SELECT count(*) FROM outbox_messages").fetchone()[0]
                samples.append({"t": time.monotonic() - started, "rows": rows,
                                **sizes("outbox_messages")})
                time.sleep(min(2.0, args.reap_every / 2))
    finally:
        stop_process(relay)
        drain.stop()
    steady = rate * (args.retention_seconds + args.reap_every / 2)
    third = [s for s in samples if s["t"] >= args.retention_duration * 2 / 3]
    middle = [s for s in samples
              if args.retention_duration / 3 <= s["t"] < args.retention_duration * 2 / 3]
    value = {"rate_per_hour": args.retention_rate, "retention_s": args.retention_seconds,
             "duration_s": args.retention_duration, "reap_every_s": args.reap_every,
             "expected_rows": steady, "samples": samples, "reaps": reaps,
             "published": len(publishers.committed), "errors": publishers.errors[:3]}
    if middle and third:
        value["heap_middle"] = max(s["heap"] for s in middle)
        value["heap_last"] = max(s["heap"] for s in third)
    log(f"  published {len(publishers.committed):,}; rows: expected about {steady:,.0f} at "
        f"steady state, last third {min((s['rows'] for s in third), default=0):,}-"
        f"{max((s['rows'] for s in third), default=0):,}; heap "
        + (f"{mb(value['heap_middle'])} (middle third) -> {mb(value['heap_last'])} (last third)"
           if "heap_last" in value else "?")
        + f"; reaps deleted {sum(r['deleted'] for r in reaps):,} in "
        f"{sum(r['seconds'] for r in reaps):.1f} s")
    results.save("retention", value)


def process_cpu(procs: list[subprocess.Popen[bytes]], master: int | None) -> dict[str, float]:
    """CPU seconds so far of the ten consumers' processes, the one behind, PostgreSQL and
    this process."""
    return {
        "ten": cpu_seconds([p.pid for p in procs[:10]]),
        "behind": cpu_seconds([p.pid for p in procs[10:]]),
        "postgresql": cpu_seconds([master, *children(master)]) if master else 0.0,
        "bench": time.process_time(),
    }


def behind_position() -> int:
    """The far-behind consumer's position (0 before its first batch)."""
    with superuser() as conn:
        row = conn.execute("SELECT last_id FROM consumer_offsets WHERE name = 'behind'").fetchone()
    return int(row[0]) if row else 0


def phase_consumers(args: argparse.Namespace, results: Results) -> None:
    from bench.scale_app import TAILS, latencies

    log(f"\n== consumers: {len(TAILS)} consumers on one stream at {args.consumer_rate:g} "
        f"messages/s, then one more starting {args.behind:,} messages behind")
    if not database_exists():
        setup_database()
    client = bench_outbox.broker()
    names = [c.name for c in TAILS]
    runs: dict[str, Any] = {}
    for label, behind, rate in (("alone", 0, 0), ("one behind", args.behind, 0),
                                (f"one behind, max_rate {BEHIND_RATE:,}", args.behind,
                                 BEHIND_RATE)):
        outbox_reset()
        for consumer in [*names, "behind"]:
            latencies(client, consumer)
        if behind:
            took = insert_backlog(behind, 100)
            log(f"  {behind:,} messages behind inserted in {took:.1f} s")
        with superuser() as conn:  # the ten start at the head (docs/consumers.md)
            for consumer in names:
                conn.execute("INSERT INTO consumer_offsets (name, partition, partition_count,"
                             " last_id, held) SELECT %s, 0, 1, now.last_id, now.held"
                             " FROM outbox_position_now_v2() AS now", [consumer])
        logs = [Path(tempfile.mkstemp(prefix="dio-scale-consumer.", suffix=".log")[1])
                for _ in range(len(names) + 1)]
        procs = [start_process(["run_consumers", consumer], path,
                               {"DIO_SCALE_CONSUMERS": "all",
                                "DIO_SCALE_BEHIND_RATE": str(rate) if rate else ""})
                 for consumer, path in zip([*names, *(["behind"] if behind else [])], logs,
                                           strict=False)]
        try:
            deadline = time.monotonic() + 60
            while not all(b"running" in path.read_bytes() for path in logs[:len(procs)]):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    sys.exit("bench: the consumers did not start\n"
                             + "\n".join(p.read_text()[-500:] for p in logs))
                time.sleep(0.1)
            # Warm-up: every process's first batches (connections, checks) are not measured.
            with Publishers(4, args.consumer_rate, 100, topic="scale.warm-up"):
                time.sleep(2.0)
            time.sleep(1.0)
            for consumer in names:
                latencies(client, consumer)
            reset_statements()
            behind_at = behind_position()
            measured = time.monotonic()
            master = postmaster_pid()
            cpu_before = process_cpu(procs, master)
            with Publishers(4, args.consumer_rate, 100, topic="scale.consumers") as publishers:
                time.sleep(args.consumer_seconds)
            time.sleep(2.0)  # the last batches, and the processes' pushes
            cpu = {k: v - cpu_before[k] for k, v in process_cpu(procs, master).items()}
            passed = behind_position() - behind_at
            measured = time.monotonic() - measured
            statements = top_statements()
        finally:
            for proc in procs:
                stop_process(proc)
            for path in logs:
                path.unlink(missing_ok=True)
        time.sleep(0.6)  # the pushes of the stopped processes
        per = {}
        for consumer in names:
            values = sorted(v * 1000 for v in latencies(client, consumer))
            per[consumer] = {"messages": len(values),
                             "p50": statistics.median(values) if values else float("nan"),
                             "p99": percentile(values, 0.99),
                             "max": values[-1] if values else float("nan")}
        run: dict[str, Any] = {"consumers": per, "published": len(publishers.committed),
                               "statements": statements, "cpu_s": cpu, "window_s": measured}
        if behind:
            run["behind_passed"] = passed
            run["behind_rate"] = passed / measured
        runs[label] = run
        p50s = [v["p50"] for v in per.values()]
        p99s = [v["p99"] for v in per.values()]
        log(f"  {label:<10}: the ten consumers' p50 {min(p50s):.1f}-{max(p50s):.1f} ms, p99 "
            f"{min(p99s):.1f}-{max(p99s):.1f} ms ({len(publishers.committed):,} messages)"
            + (f"; the one behind passed {run['behind_passed']:,} ids "
               f"({run['behind_rate']:,.0f}/s)" if behind else "")
            + f"; CPU seconds in {measured:.0f} s: the ten {cpu['ten']:.1f}, the one behind "
            f"{cpu['behind']:.1f}, PostgreSQL {cpu['postgresql']:.1f}, this process (the "
            f"publishers) {cpu['bench']:.1f}")
    results.save("consumers", {"runs": runs, "rate": args.consumer_rate,
                               "seconds": args.consumer_seconds, "behind": args.behind})


# -- main ------------------------------------------------------------------------


def sizes_list(text: str) -> list[int]:
    return [int(float(v)) for v in text.split(",") if v.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small sizes: the whole harness in a few minutes")
    parser.add_argument("--only", action="append", choices=PHASES,
                        help="run only these phases (repeatable; default: all)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help=f"JSON of the figures (default {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--no-report", action="store_true",
                        help="do not draw the plots and write docs/benchmarks.md")
    parser.add_argument("--no-statements", action="store_true",
                        help="do not load pg_stat_statements (no restart of PostgreSQL)")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    for name, value in FULL.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, list):
            parser.add_argument(flag, type=sizes_list, default=None, metavar="N,N,...")
        else:
            parser.add_argument(flag, type=type(value), default=None)
    args = parser.parse_args()
    defaults = QUICK if args.quick else FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    only = args.only or PHASES
    started = time.monotonic()
    wrk = ensure_wrk() if {"keys", "pooled", "reaper"} & set(only) else ""
    load_statement_stats(not args.no_statements)
    run = {**machine(), "quick": args.quick,
           **{name: getattr(args, name) for name in FULL}}
    results = Results(args.results, run)
    log(f"machine: {run['cores']} cores, PostgreSQL {run['postgresql']} (shared_buffers "
        f"{run['shared_buffers']}), load {run['load_start']}; "
        f"{'quick sizes' if args.quick else 'full sizes'}; phases: {', '.join(only)}")
    phases: dict[str, Callable[[], None]] = {
        "keys": lambda: phase_keys(args, results, wrk),
        "pooled": lambda: phase_pooled(args, results, wrk),
        "reaper": lambda: phase_reaper(args, results, wrk),
        "churn": lambda: phase_churn(args, results),
        "tenants": lambda: phase_tenants(args, results),
        "backlog": lambda: phase_backlog(args, results),
        "retention": lambda: phase_retention(args, results),
        "consumers": lambda: phase_consumers(args, results),
    }
    timings: dict[str, float] = {}
    try:
        for phase in PHASES:
            if phase in only:
                t0 = time.monotonic()
                phases[phase]()
                timings[phase] = time.monotonic() - t0
                log(f"  ({phase}: {timings[phase]:.0f} s)")
    finally:
        connections.close_all()
        if not args.keep:
            drop_database()
        unload_statement_stats()
    log(f"\nbench-scale: {time.monotonic() - started:.0f} s in all ("
        + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + f"); figures in "
        f"{args.results}")
    if not args.no_report:
        subprocess.run([sys.executable, str(ROOT / "bench" / "scale_report.py"),
                        str(args.results)], check=True)


if __name__ == "__main__":
    main()
