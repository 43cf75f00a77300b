"""The fault schedule and the faults: kills, restarts and a paused gateway.

The schedule is drawn from the seed before the run starts and printed: the
kinds asked for, shuffled, first (so a short run sees each one at least
once), then kinds drawn at random; the pauses between faults are
exponential around ``--fault-every`` seconds. Which gunicorn worker dies, and
how Redis or RabbitMQ stops, are drawn from the same seed as the faults happen.

The application's processes (gunicorn's master, the relay, the consumers,
Celery's worker and beat) are killed with SIGKILL and brought back by the
supervisor (scripts/supervise), never by the soak; gunicorn's workers are
brought back by their master. PostgreSQL and the broker (Redis or RabbitMQ)
are restarted here, on the ports they keep (scripts/services).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

KINDS = (
    "web-worker",       # SIGKILL one gunicorn worker (its master starts another)
    "web-master",       # SIGKILL gunicorn's master (its workers go with it)
    "relay",            # SIGKILL relay_outbox
    "consumers",        # SIGKILL run_consumers
    "celery-worker",    # SIGKILL the Celery worker (and, with it, its pool)
    "celery-beat",      # SIGKILL Celery beat
    "pg-fast",          # pg_ctl restart -m fast
    "pg-immediate",     # pg_ctl restart -m immediate (crash recovery at start)
    "redis",            # Redis stopped (SIGTERM or SIGKILL, drawn) and started again
    "gateway-pause",    # SIGSTOP the payment gateway for 2-6 s, then SIGCONT
)
#: On RabbitMQ (--broker rabbitmq) the broker's fault is RabbitMQ's node stopped
#: (SIGTERM or SIGKILL, drawn) and started again, in place of Redis's.
RABBITMQ_KINDS = tuple("rabbitmq" if kind == "redis" else kind for kind in KINDS)
#: Every kind --faults accepts.
KNOWN = (*KINDS, "rabbitmq")


def default_kinds(broker: str) -> list[str]:
    """Every kind of the soak's broker: KINDS on Redis, RABBITMQ_KINDS on RabbitMQ."""
    return list(RABBITMQ_KINDS if broker == "rabbitmq" else KINDS)


PROGRAM_OF = {"web-master": "web", "relay": "relay", "consumers": "consumers",
              "celery-worker": "worker", "celery-beat": "beat"}


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the start
    kind: str


def schedule(seed: int, duration: float, every: float, kinds: list[str]) -> list[Fault]:
    rng = random.Random(seed)
    first = list(kinds)
    rng.shuffle(first)
    faults: list[Fault] = []
    at = min(5.0, duration / 10)
    while at < duration - 2:
        kind = first.pop(0) if first else rng.choice(kinds)
        faults.append(Fault(round(at, 1), kind))
        at += min(max(rng.expovariate(1 / every), 1.0), 3 * every)
    return faults


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name, in parentheses, may hold spaces: the ppid follows the last ')'
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


def as_server(argv: list[str]) -> list[str]:
    """PostgreSQL's tools run as the 'postgres' account when we are root (scripts/services)."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def pg_bindir() -> Path:
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    return sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                  key=lambda p: int(p.parent.name))[-1]


class Injector:
    """Runs the schedule in a thread of its own; ``counts`` says what was injected."""

    def __init__(self, faults: list[Fault], run_dir: Path, root: Path, seed: int,
                 say) -> None:
        self.faults = faults
        self.run_dir = run_dir
        self.root = root
        self.rng = random.Random(seed + 1)
        self.say = say
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)
        self._started = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        """No more faults, once one of each kind has happened."""
        self._stop.set()
        self._thread.join(600)

    def _run(self) -> None:
        # The first faults, one of each kind, all happen even when the load ends
        # before their time (a slow machine): at once, then.
        each_once = len({fault.kind for fault in self.faults})
        for index, fault in enumerate(self.faults):
            wait = self._started + fault.at - time.monotonic()
            if self._stop.wait(max(wait, 0)) and index >= each_once:
                return
            try:
                detail = getattr(self, "_" + fault.kind.replace("-", "_"))()
            except Exception as exc:  # a fault that could not be injected is reported, not fatal
                self.failures.append(f"{fault.kind}: {exc}")
                self.say(f"fault {fault.kind} at {fault.at:g} s could not be injected: {exc}")
                continue
            self.counts[fault.kind] += 1
            self.say(f"fault {fault.kind} at {fault.at:g} s: {detail}")

    # --- the application's processes (the supervisor brings them back) ---------

    def _pid(self, program: str) -> int:
        return int((self.run_dir / f"{program}.pid").read_text())

    def _kill_program(self, kind: str) -> str:
        program = PROGRAM_OF[kind]
        pid = self._pid(program)
        os.kill(pid, signal.SIGKILL)
        self._wait_restarted(program, pid)
        return f"SIGKILL {program} pid {pid}; the supervisor started pid {self._pid(program)}"

    def _wait_restarted(self, program: str, old: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self._pid(program) != old:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the supervisor did not start {program} again within {timeout:g} s")

    def _web_master(self) -> str:
        return self._kill_program("web-master")

    def _relay(self) -> str:
        return self._kill_program("relay")

    def _consumers(self) -> str:
        return self._kill_program("consumers")

    def _celery_worker(self) -> str:
        return self._kill_program("celery-worker")

    def _celery_beat(self) -> str:
        return self._kill_program("celery-beat")

    def _web_worker(self) -> str:
        deadline = time.monotonic() + 30  # a master just restarted is still forking them
        while True:
            master = self._pid("web")
            workers = children(master)
            if workers:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn (pid {master}) has had no worker for 30 s")
            time.sleep(0.2)
        victim = self.rng.choice(workers)
        os.kill(victim, signal.SIGKILL)
        return f"SIGKILL gunicorn worker pid {victim} (master {master})"

    def _gateway_pause(self) -> str:
        pid = self._pid("gateway")
        pause = round(self.rng.uniform(2, 6), 1)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(pause)
        finally:
            os.kill(pid, signal.SIGCONT)
        return f"gateway pid {pid} stopped for {pause:g} s"

    # --- the servers ------------------------------------------------------------

    def _pg(self, mode: str) -> str:
        directory = Path(os.environ["DIO_PGSOCKET"])
        started = time.monotonic()
        subprocess.run(
            as_server([str(pg_bindir() / "pg_ctl"), "-D", str(directory / "data"),
                       "-l", str(directory / "server.log"), "-m", mode, "-w", "-t", "120",
                       "restart"]),
            check=True, capture_output=True, timeout=180,
        )
        return f"PostgreSQL restarted (-m {mode}) in {time.monotonic() - started:.1f} s"

    def _pg_fast(self) -> str:
        return self._pg("fast")

    def _pg_immediate(self) -> str:
        return self._pg("immediate")

    def _redis(self) -> str:
        directory = self.root / ".run" / "redis"
        pid = int((directory / "redis.pid").read_text())
        sig = self.rng.choice([signal.SIGTERM, signal.SIGKILL])
        started = time.monotonic()
        os.kill(pid, sig)
        deadline = time.monotonic() + 60
        while Path(f"/proc/{pid}").exists() and not _zombie(pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"Redis (pid {pid}) did not stop")
            time.sleep(0.05)
        subprocess.run(["redis-server", str(directory / "redis.conf")], check=True,
                       capture_output=True, timeout=30)
        port = (directory / "port").read_text().strip()
        for _ in range(300):
            if subprocess.run(["redis-cli", "-p", port, "ping"], capture_output=True,
                              text=True).stdout.strip() == "PONG":
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("Redis did not answer after its restart")
        return (f"Redis pid {pid} stopped with {signal.Signals(sig).name} and started again "
                f"on :{port} in {time.monotonic() - started:.1f} s")

    def _rabbitmq(self) -> str:
        """SIGKILL: the node crashes; SIGTERM: it shuts down cleanly. scripts/services
        starts it again on its ports, with its data (what it confirmed is on disk)."""
        directory = self.root / ".run" / "rabbitmq"
        pid = int((directory / "node.pid").read_text())
        sig = self.rng.choice([signal.SIGTERM, signal.SIGKILL])
        started = time.monotonic()
        os.kill(pid, sig)
        deadline = time.monotonic() + 90
        while Path(f"/proc/{pid}").exists() and not _zombie(pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ (pid {pid}) did not stop")
            time.sleep(0.05)
        subprocess.run([str(self.root / "scripts" / "services"), "start", "rabbitmq"],
                       check=True, capture_output=True, timeout=120)
        port = (directory / "port").read_text().strip()
        return (f"RabbitMQ pid {pid} stopped with {signal.Signals(sig).name} and started again "
                f"on :{port} in {time.monotonic() - started:.1f} s")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False
