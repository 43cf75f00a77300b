"""scripts/supervise, the demo's and the soak's supervisor: whatever dies comes back."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.live import ROOT

SUPERVISE = str(ROOT / "scripts" / "supervise")


def said(directory: Path) -> str:
    """What the supervisor has logged so far."""
    return (directory / "supervise.err").read_text()


def pid(directory: Path, name: str) -> int:
    return int((directory / f"{name}.pid").read_text())


def alive(process_id: int) -> bool:
    try:
        state = Path(f"/proc/{process_id}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def supervised(tmp_path):
    """Start the supervisor on a Procfile; its log (standard error) is ``tmp_path/supervise.err``,
    read as it grows with :func:`said`."""
    started: list[subprocess.Popen] = []

    def start(procfile: str, *args: str) -> subprocess.Popen:
        (tmp_path / "Procfile").write_text(procfile)
        with open(tmp_path / "supervise.err", "w") as err:
            proc = subprocess.Popen([sys.executable, SUPERVISE, str(tmp_path), "--grace", "5",
                                     *args], stderr=err, text=True, start_new_session=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for pidfile in tmp_path.glob("*.pid"):
        try:
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


SLEEPER = f"{sys.executable} -c 'import time; time.sleep(600)'"
# A parent that leaves a child of its own (in its process group), as gunicorn's
# master leaves its workers: the child's pid is written next to the logs.
PARENT = (f"{sys.executable} -c 'import subprocess, sys, time; "
          f"c = subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(600)\"]); "
          f"print(c.pid, flush=True); time.sleep(600)'")


def test_a_killed_process_is_started_again_and_its_orphans_are_killed(supervised, tmp_path):
    proc = supervised(f"sleeper: {SLEEPER}\nparent: {PARENT}\n")
    wait_for(lambda: (tmp_path / "parent.log").exists()
             and (tmp_path / "parent.log").read_text().strip(), "the parent's child")
    child = int((tmp_path / "parent.log").read_text().split()[0])
    first, parent = pid(tmp_path, "sleeper"), pid(tmp_path, "parent")
    os.kill(first, signal.SIGKILL)
    os.kill(parent, signal.SIGKILL)
    wait_for(lambda: pid(tmp_path, "sleeper") != first, "the sleeper started again")
    wait_for(lambda: pid(tmp_path, "parent") != parent, "the parent started again")
    assert alive(pid(tmp_path, "sleeper"))
    wait_for(lambda: not alive(child), "the orphaned child killed")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    log = said(tmp_path)
    assert f"sleeper (pid {first}) exited (SIGKILL)" in log
    assert "sleeper: 1 restart(s)" in log and "parent: 1 restart(s)" in log


def test_sigterm_stops_everything_and_kills_what_ignores_it(supervised, tmp_path):
    stubborn = (f"{sys.executable} -c 'import signal, time; "
                f"signal.signal(signal.SIGTERM, signal.SIG_IGN); print(\"ignoring\", flush=True);"
                f" time.sleep(600)'")
    proc = supervised(f"sleeper: {SLEEPER}\nstubborn: {stubborn}\n")
    wait_for(lambda: (tmp_path / "stubborn.pid").exists()
             and (tmp_path / "sleeper.pid").exists(), "both started")
    wait_for(lambda: "ignoring" in (tmp_path / "stubborn.log").read_text(),
             "the stubborn one to set its handler")
    pids = [pid(tmp_path, "sleeper"), pid(tmp_path, "stubborn")]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert not any(alive(p) for p in pids)
    assert "stubborn (pid" in said(tmp_path)
    assert not list(tmp_path.glob("*.pid"))


def test_a_process_that_keeps_dying_young_waits_longer_each_time(supervised, tmp_path):
    proc = supervised(f"crasher: {sys.executable} -c 'raise SystemExit(3)'\n")
    wait_for(lambda: said(tmp_path).count("crasher started again") >= 3, "three restarts")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    log = said(tmp_path)
    found = re.findall(r"exited \(status 3\).*starting it again in ([\d.]+) s", log)
    pauses = [float(p) for p in found]
    assert pauses[:3] == [0.5, 1.0, 2.0], log
    assert len(pauses) <= 5  # backed off, not a busy loop


@pytest.mark.parametrize("args, pause", [(["--healthy-after", "1"], "0.0"), ([], "0.5")],
                         ids=["healthy-after-1s", "default-10s"])
def test_a_process_that_lived_long_enough_is_started_again_at_once(supervised, tmp_path,
                                                                   args, pause):
    proc = supervised(f"sleeper: {SLEEPER}\n", *args)
    wait_for(lambda: (tmp_path / "sleeper.pid").exists(), "the sleeper started")
    first = pid(tmp_path, "sleeper")
    started = time.monotonic()
    wait_for(lambda: time.monotonic() - started > 1.2, "the sleeper to live past 1 s")
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: pid(tmp_path, "sleeper") != first, "the sleeper started again")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    log = said(tmp_path)
    assert re.search(rf"exited \(SIGKILL\) after \d+\.\d s; starting it again in {pause} s",
                     log), log


def test_a_bad_procfile_is_one_line_and_a_non_zero_exit(tmp_path):
    (tmp_path / "Procfile").write_text("just a command with no name\n")
    done = subprocess.run([sys.executable, SUPERVISE, str(tmp_path)], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0
    assert "expected 'name: command'" in done.stderr
