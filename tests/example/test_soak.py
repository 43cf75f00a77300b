"""The 60-second soak: every fault kind at least once, then every invariant PASS.

The soak (example_project/soak) runs as a subprocess on this run's PostgreSQL
and Redis, which it restarts on their ports while it runs. Whatever happens
to it, the fixture stops every process it started, by the PIDs in its run
directory, and makes sure both servers are up again for the tests that follow.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
from django.db import connections

from example_project.soak.__main__ import stop_run_dir
from example_project.soak.faults import KINDS
from tests.live import ROOT


@pytest.fixture
def soak(tmp_path):
    procs: list[subprocess.Popen] = []

    def run(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
        proc = subprocess.Popen(
            [sys.executable, "-m", "example_project.soak", "--run-dir", str(tmp_path),
             "--database", "soak_test", *args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
            start_new_session=True,
        )
        procs.append(proc)
        out, _ = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out)

    connections.close_all()
    try:
        yield run
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        stop_run_dir(tmp_path)
        # a soak that died in the middle of a restart leaves a server down
        subprocess.run([str(ROOT / "scripts" / "services"), "start", "pg", "redis"],
                       cwd=ROOT, capture_output=True, timeout=180, check=True)
        connections.close_all()


def test_sixty_seconds_of_every_fault_kind_keep_every_invariant(soak):
    done = soak("--duration", "60", "--seed", "11", "--fault-every", "3",
                "--drain-timeout", "400")
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-6000:]
    assert done.stdout.rstrip().endswith("soak: every invariant PASS")
    injected = dict(re.findall(r"^  ([a-z-]+) +(\d+)$", done.stdout, re.MULTILINE))
    assert all(int(injected[kind]) >= 1 for kind in KINDS), injected
    assert int(re.search(r"^  pending keys +(\d+)$", done.stdout, re.MULTILINE)[1]) == 0


def test_bad_arguments_are_one_line_and_exit_2(soak):
    done = soak("--faults", "web-master,meteor", timeout=60)
    assert done.returncode == 2
    assert "unknown fault kind(s) meteor" in done.stdout
