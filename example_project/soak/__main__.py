"""The fault-injection soak of the example shop: ``make soak ARGS="--duration 600"``.

    python -m example_project.soak [--broker redis|rabbitmq] [--duration S] [--seed N]
        [--threads N] [--fault-every S] [--lose P] [--duplicate P] [--faults KIND,...]
        [--drain-timeout S] [--run-dir DIR] [--database NAME]

Needs PostgreSQL and the broker from scripts/services (``make soak`` starts and
stops them; ``make soak BROKER=rabbitmq`` runs the shop's Celery on RabbitMQ,
with publisher confirms, and restarts RabbitMQ where it would restart Redis).
It creates a database of its own, starts the shop's processes under
scripts/supervise (gateway, gunicorn, Celery worker and beat, the relay, the
consumers), puts a lossy proxy in front of gunicorn, runs clients
that order and pay while the seeded fault schedule kills and restarts things,
then stops the clients and the faults, waits for the drain, prints the table
and the invariants, stops every process it started, and exits 1 if any
invariant does not hold (2 on a usage or setup error). Logs stay in the run
directory (default .run/soak).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from . import check
from .faults import KINDS, KNOWN, Injector, default_kinds, schedule
from .load import Load
from .proxy import LossyProxy

ROOT = Path(__file__).resolve().parents[2]
STARTED = time.monotonic()


def say(text: str) -> None:
    print(f"[soak {time.monotonic() - STARTED:6.1f} s] {text}", flush=True)


def fail_setup(text: str) -> None:
    print(f"soak: error: {text}", file=sys.stderr, flush=True)
    sys.exit(2)


def positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value
    return parse


def probability(text: str) -> float:
    value = float(text)
    if not 0 <= value < 0.5:
        raise argparse.ArgumentTypeError(f"must be between 0 and 0.5, not {text}")
    return value


def fault_kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KNOWN]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown fault kind(s) {', '.join(unknown) or '(none)'}; known: {', '.join(KNOWN)}")
    return kinds


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m example_project.soak",
                                     description="A fault-injection soak of the example shop.")
    parser.add_argument("--broker", choices=["redis", "rabbitmq"],
                        default=os.environ.get("DIO_SOAK_BROKER", "redis"),
                        help="Celery's broker (default redis; DIO_SOAK_BROKER sets it too)")
    parser.add_argument("--duration", type=positive(float), default=600.0,
                        help="seconds of load and faults, before the drain (default 600)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the fault schedule, the proxy and the clients "
                             "(default: drawn, and printed)")
    parser.add_argument("--threads", type=positive(int), default=6,
                        help="client threads (default 6)")
    parser.add_argument("--fault-every", type=positive(float), default=8.0,
                        help="mean seconds between two faults (default 8)")
    parser.add_argument("--lose", type=probability, default=0.05,
                        help="share of answers the proxy loses (default 0.05)")
    parser.add_argument("--duplicate", type=probability, default=0.05,
                        help="share of requests the proxy sends twice (default 0.05)")
    parser.add_argument("--faults", type=fault_kinds, default=None,
                        help="comma-separated fault kinds (default: all of the broker's: "
                             + ",".join(KINDS) + "; rabbitmq in place of redis on RabbitMQ)")
    parser.add_argument("--drain-timeout", type=positive(float), default=300.0,
                        help="seconds to wait for the clients' last answers and for the drain "
                             "(default 300; a killed Celery worker's task waits for the "
                             "visibility timeout)")
    parser.add_argument("--visibility-timeout", type=positive(int), default=20,
                        help="Redis's visibility timeout for Celery, in seconds (default 20)")
    parser.add_argument("--no-rewind", dest="rewind_lost", action="store_false",
                        help="leave messages the broker lost as they are (their receipts "
                             "then fail the check) instead of applying the runbook: "
                             "relay_outbox --rewind-to a second before the first")
    parser.add_argument("--run-dir", type=Path, default=ROOT / ".run" / "soak",
                        help="logs, pid files, the Procfile (default .run/soak)")
    parser.add_argument("--database", default="soak", help="the database to (re)create")
    args = parser.parse_args(argv)
    if args.faults is None:
        args.faults = default_kinds(args.broker)
    wrong = {"redis": "rabbitmq", "rabbitmq": "redis"}[args.broker]
    if wrong in args.faults:
        parser.error(f"--faults {wrong}: the soak runs on {args.broker}")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**6)
    return args


class Supervised:
    """The shop's processes under scripts/supervise, stopped by PID whatever happens."""

    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.run_dir = run_dir
        self.env = env
        self.popen: subprocess.Popen | None = None

    def start(self, programs: dict[str, list[str]]) -> None:
        import shlex
        (self.run_dir / "Procfile").write_text(
            "".join(f"{name}: {shlex.join(argv)}\n" for name, argv in programs.items()))
        log = open(self.run_dir / "supervise.log", "ab")  # noqa: SIM115
        self.popen = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "supervise"), str(self.run_dir)],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        (self.run_dir / "supervise.pid").write_text(f"{self.popen.pid}\n")
        atexit.register(self.stop)

    def stop(self) -> None:
        """SIGTERM to the supervisor (it stops its processes), then SIGKILL what is left."""
        stop_run_dir(self.run_dir)


def stop_run_dir(run_dir: Path) -> None:
    """Stop the supervisor and every process whose pid file is in run_dir (idempotent)."""
    pids = {}
    for pidfile in run_dir.glob("*.pid"):
        try:
            pids[pidfile.stem] = int(pidfile.read_text())
        except (OSError, ValueError):
            continue
    if "gateway" in pids:
        _signal(pids["gateway"], signal.SIGCONT)  # a paused gateway cannot stop
    supervisor = pids.pop("supervise", None)
    if supervisor is not None and _signal(supervisor, signal.SIGTERM):
        deadline = time.monotonic() + 40
        while _alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal(supervisor, signal.SIGKILL)
    for pid in pids.values():  # left only if the supervisor could not stop them
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pidfile in run_dir.glob("*.pid"):
        pidfile.unlink(missing_ok=True)


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    if state == "Z":
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, every: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except Exception:  # a server restarting: ask again
            pass
        time.sleep(every)
    say(f"gave up waiting for {what} after {timeout:g} s")
    return False


def prepare(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, dict]]:
    """The environment of the shop's processes, its fresh database, and the users."""
    needed = ("DIO_PGPORT", "DIO_PGSOCKET",
              "DIO_AMQP_URL" if args.broker == "rabbitmq" else "DIO_REDIS_URL")
    for name in needed:
        if not os.environ.get(name):
            fail_setup(f"{name} is not set: run the soak under scripts/services "
                       f"(make soak BROKER={args.broker} ARGS=..., or scripts/services run pg "
                       f"{'redis rabbitmq' if args.broker == 'rabbitmq' else 'redis'} -- ...)")
    port, db = os.environ["DIO_PGPORT"], args.database
    app, worker, system, owner = (os.environ.get(f"DIO_{r}_ROLE", f"dio_{r.lower()}")
                                  for r in ("APP", "WORKER", "SYSTEM", "OWNER"))
    if args.broker == "rabbitmq":
        broker = os.environ["DIO_AMQP_URL"]  # example_project/settings.py turns confirms on
    else:
        broker = os.environ["DIO_REDIS_URL"].rsplit("/", 1)[0] + "/7"  # a Redis database of its own
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": f"postgres://{app}:{app}@127.0.0.1:{port}/{db}",
        "WORKER_DATABASE_URL": f"postgres://{worker}:{worker}@127.0.0.1:{port}/{db}",
        "SYSTEM_DATABASE_URL": f"postgres://{system}:{system}@127.0.0.1:{port}/{db}",
        "OWNER_DATABASE_URL": f"postgres://{owner}:{owner}@127.0.0.1:{port}/{db}",
        "CELERY_BROKER_URL": broker,
        "GATEWAY_URL": f"http://127.0.0.1:{free_port()}",
        "CELERY_VISIBILITY_TIMEOUT": str(args.visibility_timeout),
        "RECEIVER_RETRY_BACKOFF_MAX": str(max(args.visibility_timeout // 2, 1)),
        "CONN_HEALTH_CHECKS": "1",
    }
    run = lambda *cmd: subprocess.run(  # noqa: E731
        [sys.executable, "manage.py", *cmd], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300)
    done = run("prepare_demo_database")
    if done.returncode:
        fail_setup(f"prepare_demo_database failed: {done.stderr.strip().splitlines()[-1:]}")
    seeded = run("seed_demo")
    if seeded.returncode:
        fail_setup(f"seed_demo failed: {seeded.stderr.strip().splitlines()[-1:]}")
    tokens = json.loads(seeded.stdout)
    users = {}
    with check.connect(db) as conn:
        conn.execute("UPDATE shop_product SET stock = 1000000000")  # a soak never runs out
        for name, user in tokens.items():
            skus = [s for (s,) in conn.execute(
                "SELECT sku FROM shop_product WHERE tenant_id = %s ORDER BY sku",
                [user["merchant"]])]
            users[name] = {"token": user["token"], "skus": skus}
    check.empty_broker(broker)
    return env, users


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    stop_run_dir(args.run_dir)  # what an earlier soak left, if anything
    for old in args.run_dir.glob("*.log"):
        old.unlink()
    faults = schedule(args.seed, args.duration, args.fault_every, args.faults)
    say(f"broker {args.broker}; seed {args.seed}; {args.duration:g} s of load from "
        f"{args.threads} clients; proxy loses "
        f"{args.lose:.0%} of answers, duplicates {args.duplicate:.0%} of requests")
    say(f"fault schedule ({len(faults)}): "
        + ", ".join(f"{f.at:g} s {f.kind}" for f in faults))
    env, users = prepare(args)
    say(f"database {args.database} created and seeded; logs in {args.run_dir}")
    web_port = free_port()
    bin_dir = Path(sys.executable).parent
    supervised = Supervised(args.run_dir, env)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        supervised.start({
            "gateway": [sys.executable, "example_project/gateway.py",
                        env["GATEWAY_URL"].rsplit(":", 1)[1]],
            "web": [str(bin_dir / "gunicorn"), "example_project.wsgi:application",
                    "--bind", f"127.0.0.1:{web_port}", "--workers", "2", "--threads", "4",
                    "--worker-class", "gthread", "--timeout", "30", "--log-level", "warning"],
            "worker": [str(bin_dir / "celery"), "-A", "example_project", "worker",
                       "--loglevel=warning", "--concurrency=2"],
            "beat": [str(bin_dir / "celery"), "-A", "example_project", "beat",
                     "--loglevel=warning", "--schedule", str(args.run_dir / "beat-schedule")],
            "relay": [sys.executable, "manage.py", "relay_outbox"],
            "consumers": [sys.executable, "manage.py", "run_consumers"],
        })
        direct = f"http://127.0.0.1:{web_port}"
        if not wait_until(lambda: requests.get(direct + "/schema/", timeout=2).ok, 60,
                          "the web server"):
            fail_setup(f"the web server did not start; see {args.run_dir}/web.log")
        proxy = LossyProxy(web_port, lose=args.lose, duplicate=args.duplicate, seed=args.seed)
        proxy_port = proxy.start()
        say(f"shop up: gunicorn :{web_port} behind the lossy proxy :{proxy_port}")
        load = Load(f"http://127.0.0.1:{proxy_port}", users, threads=args.threads,
                    seed=args.seed)
        injector = Injector(faults, args.run_dir, ROOT, args.seed, say)
        load.start()
        injector.start()
        end = STARTED + (time.monotonic() - STARTED) + args.duration
        while time.monotonic() < end:
            time.sleep(min(10.0, max(end - time.monotonic(), 0)))
            done = sum(1 for i in load.intents if i.done)
            say(f"{len(load.intents)} intents, {done} done; "
                f"{sum(injector.counts.values())} faults; proxy {dict(proxy.counts)}")
        say("stopping the faults and the new intents; the clients finish theirs")
        load.stop_new_intents()
        injector.stop()
        drain_end = time.monotonic() + args.drain_timeout
        finished = load.finish(args.drain_timeout)
        say(f"clients done ({'every intent answered' if finished else 'some intents unanswered'}); "
            "draining")
        snap = None
        stalls = 0

        def settled(stall_ends_it: bool = True) -> bool:
            """Drained, or stalled on messages the broker lost (three looks in a row)."""
            nonlocal snap, stalls
            snap = check.snapshot(args.database, env["GATEWAY_URL"], env["CELERY_BROKER_URL"])
            stalls = stalls + 1 if check.stalled(snap) else 0
            return check.drained(load.intents, snap) or (stall_ends_it and stalls >= 3)

        wait_until(settled, max(drain_end - time.monotonic(), 30), "the drain", every=2)
        if snap is None:
            snap = check.snapshot(args.database, env["GATEWAY_URL"], env["CELERY_BROKER_URL"])
        lost: list[tuple[str, str]] = []
        if check.stalled(snap):
            lost = check.paid_messages(args.database, check.missing_receipts(snap))
            say(f"the broker lost {len(lost)} order.paid message(s), neither queued nor "
                f"unacknowledged nor received: {', '.join(m for m, _ in lost)}")
            if args.rewind_lost and lost:
                rewind_lost(env, lost)
                wait_until(lambda: settled(stall_ends_it=False),
                           max(drain_end - time.monotonic(), 60), "the drain", every=2)
        proxy.stop()
    finally:
        supervised.stop()
    restarts = [line for line in (args.run_dir / "supervise.log").read_text().splitlines()
                if "started again" in line]
    return report(args, load, injector, proxy, snap, restarts, lost)


def rewind_lost(env: dict[str, str], lost: list[tuple[str, str]]) -> None:
    """docs/operations.md's runbook: rewind the relay to a second before the first loss."""
    from datetime import datetime, timedelta

    since = (datetime.fromisoformat(lost[0][1]) - timedelta(seconds=1)).isoformat()
    done = subprocess.run(
        [sys.executable, "manage.py", "relay_outbox", "--rewind-to", since], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=300)
    say(f"relay_outbox --rewind-to {since}: "
        + (done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or ["?"])[-1])


def report(args, load, injector, proxy, snap, restarts, lost) -> int:
    results = check.invariants(load.intents, snap)
    missing = [k for k in args.faults if not injector.counts[k]]
    results.append(("every fault kind injected at least once", not missing,
                    f"missing: {', '.join(missing)}" if missing else f"{len(args.faults)} kinds"))
    if injector.failures:
        results.append(("every scheduled fault injected", False, "; ".join(injector.failures)))
    width = 58
    lines = ["", f"soak: {args.broker}, seed {args.seed}, {args.duration:g} s, "
             f"{args.threads} clients",
             "", "faults injected".ljust(width) + "count"]
    lines += [f"  {kind}".ljust(width) + str(injector.counts[kind]) for kind in args.faults]
    lines += [f"  proxy: {fate}".ljust(width) + str(proxy.counts[fate])
              for fate in ("passed", "lost", "duplicated", "unreachable")]
    lines += ["  supervisor restarts".ljust(width) + str(len(restarts))]
    lines += ["", "answers the clients saw".ljust(width) + "count"]
    lines += [f"  {answer}".ljust(width) + str(n) for answer, n in sorted(load.answers.items())]
    lines += ["", "counts".ljust(width) + "count"]
    lines += [f"  {name}".ljust(width) + str(n) for name, n in check.counts(load.intents, snap)]
    lines += ["  order.paid messages the broker lost".ljust(width) + str(len(lost))]
    again = ", sent again by the rewind" if args.rewind_lost else ""
    lines += [f"    {message} (published {created}){again}" for message, created in lost]
    rows = [(f"  {name} ({detail})", "PASS" if ok else "FAIL") for name, ok, detail in results]
    wide = max(len(text) for text, _ in rows) + 2
    lines += ["", "invariants".ljust(wide) + "result"]
    lines += [text.ljust(wide) + verdict for text, verdict in rows]
    failed = [name for name, ok, _ in results if not ok]
    lines += ["", f"soak: {'FAIL: ' + '; '.join(failed) if failed else 'every invariant PASS'}"]
    print("\n".join(lines), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
