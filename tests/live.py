"""A real WSGI server in a subprocess, for tests that need separate processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """gunicorn serving tests.wsgi on a free loopback port."""

    def __init__(self, workers: int = 2, threads: int = 16, timeout: int = 30) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable,
            "-m",
            "gunicorn",
            "tests.wsgi:application",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            "--worker-class",
            "gthread",
            "--timeout",
            str(timeout),
            "--graceful-timeout",
            "5",
            "--log-level",
            "warning",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LiveServer:
        self.proc = subprocess.Popen(self.args, cwd=ROOT, env={**os.environ})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.proc.returncode}")
            try:
                requests.get(self.url + "/orders/", timeout=5)
                return self
            except (requests.ConnectionError, requests.Timeout):
                # A worker's first answer loads Django and connects: on a busy
                # machine it may take longer than one attempt waits.
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("gunicorn did not start within 30 s")

    def worker_pids(self) -> list[int]:
        assert self.proc is not None
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True
        ).stdout
        return [int(pid) for pid in out.split()]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
