"""Real processes for the fault tests: a Redis of the test's own, a Celery worker.

A test that restarts Redis gets a server of its own (``redis-server`` on a
free loopback port, its files in the test's temporary directory), so that the
suite's Redis and everybody else's queues are left alone. A worker runs in a
process group of its own, so that a SIGKILL takes its pool processes with it,
as a crashed host or an OOM kill of the whole group would.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from tests.live import free_port
from tests.outbox.helpers import PATIENCE, ROOT, wait_for


class RedisServer:
    """A private ``redis-server``; ``persistent`` turns on the append-only file.

    With ``appendfsync always`` every write is on disk before Redis answers, so
    even a SIGKILL loses nothing; ``everysec`` (the usual production choice)
    may lose the last second of writes on a crash, nothing on a clean restart.
    """

    def __init__(self, directory: Path, *, persistent: bool, fsync: str = "always") -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.persistent = persistent
        self.fsync = fsync
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        args = [
            "redis-server", "--bind", "127.0.0.1", "--port", str(self.port),
            "--dir", str(self.directory), "--logfile", str(self.directory / "redis.log"),
            "--save", "",
        ]
        if self.persistent:
            args += ["--appendonly", "yes", "--appendfsync", self.fsync]
        else:
            args += ["--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._answers, f"redis-server on port {self.port}")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"redis-server exited: {self.log()[-2000:]}")
        try:
            return bool(self.client().ping())
        except redis.ConnectionError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5)

    def log(self) -> str:
        path = self.directory / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: Redis shuts down cleanly (flushing its AOF); SIGKILL: a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()

    def queue_length(self, queue: str) -> int:
        with self.client() as client:
            return int(client.llen(queue))


class Worker:
    """``celery worker`` as a subprocess in its own process group, its output in a file."""

    def __init__(self, app: str, queue: str, log: Path, *, concurrency: int = 2,
                 env: dict[str, str] | None = None) -> None:
        self.log = log
        self._file = open(log, "ab")  # noqa: SIM115
        args = [
            sys.executable, "-m", "celery", "-A", app, "worker",
            "-P", "prefork", "-c", str(concurrency), "-Q", queue,
            "--without-mingle", "--without-gossip", "--without-heartbeat",
            "-l", "info", "-n", f"{queue}-{os.getpid()}-{time.monotonic_ns()}@%h",
        ]
        self.popen = subprocess.Popen(
            args, cwd=ROOT, stdout=self._file, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> Worker:
        wait_for(lambda: "ready." in self.output or self.popen.poll() is not None,
                 f"the worker to be ready ({self.log.name})")
        assert "ready." in self.output, self.output[-3000:]
        return self

    def task_ids(self, pattern: str) -> set[str]:
        """Ids of the tasks whose log lines match ``pattern`` (after ``[<id>] ``)."""
        return set(re.findall(r"\[([0-9a-f-]{36})\] " + pattern, self.output))

    def kill_group(self) -> None:
        """SIGKILL the worker and its pool processes at once, as a crash would."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(PATIENCE)

    def stop(self) -> int:
        """Warm shutdown (SIGTERM): tasks in flight finish; returns the exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(PATIENCE)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self._file.close()
        return self.popen.returncode

    def kill(self) -> None:
        """Clean-up: whatever is left of the group goes."""
        try:
            if self.popen.poll() is None:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
            else:
                os.killpg(self.popen.pid, signal.SIGKILL)  # orphaned pool processes, if any
        except ProcessLookupError:
            pass
        if not self._file.closed:
            self._file.close()
