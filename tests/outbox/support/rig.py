"""Real processes for the fault tests: a Redis or RabbitMQ of the test's own, a Celery worker.

A test that restarts Redis gets a server of its own (``redis-server`` on a
free loopback port, its files in the test's temporary directory), so that the
suite's Redis and everybody else's queues are left alone; a test that restarts
RabbitMQ gets a node of its own the same way (:class:`RabbitServer`). A worker runs in a
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
from kombu import Connection

from tests.live import free_port
from tests.outbox.support.helpers import PATIENCE, ROOT, wait_for


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


RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")


class RabbitServer:
    """A private RabbitMQ node, as scripts/services starts one, its files in ``directory``.

    Its own node name, Erlang cookie (``HOME``), epmd and ports, all on
    127.0.0.1. :meth:`stop` with SIGKILL is a crash of the broker: RabbitMQ
    keeps what it confirmed (persistent messages on durable queues are on
    disk before the confirm), nothing else.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port, self.dist_port, self.epmd_port = free_port(), free_port(), free_port()
        self.url = f"amqp://dio:dio@127.0.0.1:{self.port}//"
        self.node = f"dio-test-{self.port}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None
        (directory / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "default_user = dio\ndefault_pass = dio\nloopback_users = none\n"
            "log.console = false\n")
        (directory / "enabled_plugins").write_text("[].\n")
        (directory / "advanced.config").write_text("[].\n")
        (directory / "rabbitmq-env.conf").write_text("")

    def env(self) -> dict[str, str]:
        d = self.directory
        return {
            **os.environ, "HOME": str(d), "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"), "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_PID_FILE": str(d / "node.pid"), "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS":
                "-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}",
        }

    def start(self) -> RabbitServer:
        if self.epmd is None or self.epmd.poll() is not None:
            self.epmd = subprocess.Popen(
                ["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        (self.directory / "node.pid").unlink(missing_ok=True)
        with open(self.directory / "server.out", "ab") as out:
            self.proc = subprocess.Popen(
                [str(RABBITMQ_BIN / "rabbitmq-server")], env=self.env(), stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(self._answers, f"RabbitMQ on port {self.port}")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"rabbitmq-server exited: {self.log()[-2000:]}")
        if not (self.directory / "node.pid").exists():
            return False
        try:
            with Connection(self.url, connect_timeout=1) as connection:
                connection.connect()
            return True
        except OSError:
            return False

    def log(self) -> str:
        path = self.directory / "server.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def node_pid(self) -> int:
        return int((self.directory / "node.pid").read_text())

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: a clean shutdown; SIGKILL: a crash of the node (the VM dies at once)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.node_pid(), sig)
            except (OSError, ValueError):
                pass
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()

    def close(self) -> None:
        """Stop the node (a crash is enough: its files are the test's) and its epmd."""
        self.stop(signal.SIGKILL)
        if self.epmd is not None and self.epmd.poll() is None:
            self.epmd.kill()
            self.epmd.wait()

    def queue_length(self, queue: str) -> int:
        return amqp_queue_length(self.url, queue)


def amqp_queue_length(url: str, queue: str) -> int:
    """Messages ready in a RabbitMQ queue (0 when there is no such queue)."""
    from amqp.exceptions import NotFound

    with Connection(url) as connection:
        try:
            return int(connection.default_channel.queue_declare(queue, passive=True)
                       .message_count)
        except NotFound:
            return 0


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
