"""A web process of the previous release keeps working on this release's schema.

During a rolling deploy this release's ``migrate`` runs first; then web
processes of both releases serve requests against the migrated schema until
the old ones are replaced. The previous release, 0.2.0 (commit
``a93532c``), is installed from its own tree and its own pyproject.toml into a
virtualenv of its own (kept under ``.run/``); its web process (its
tests/testapp, under its own tests.settings, in gunicorn) and this release's
serve one database that this release migrated, side by side. Through either:
a keyed POST that publishes, its replay (through the other process too: a
client's retry may reach either), a tenant-scoped GET; and this release's
relay delivers what the old process published, and the old relay, still
running while the new one starts, reads the migrated outbox too (its readers'
functions kept their names and meaning: CHANGELOG.md's upgrade notes).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import requests
from django.conf import settings

from tests.dbsetup import owner_dsn, template_name
from tests.helpers import unavailable
from tests.live import ROOT, free_port

PREVIOUS = "a93532c"  # 0.2.0
#: The checkout whose history holds the previous release: this one, or the one a copy
#: without history was made from (mutants/run.py sets DIO_REPOSITORY for its scratch trees).
REPOSITORY = Path(os.environ.get("DIO_REPOSITORY", ROOT))
HOME = REPOSITORY / ".run" / f"rolling-{PREVIOUS}"
NAME = os.environ.get("DIO_TEST_DB", "dio_test") + "_rolling"

pytestmark = [
    pytest.mark.live_server,
    pytest.mark.direct_sessions(reason="both releases' processes connect to a database of "
                                "their own, directly"),
]


def _run(args: list[str], **kwargs: object) -> str:
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{args}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return str(done.stdout + done.stderr)


@pytest.fixture(scope="module")
def previous() -> Path:
    """The previous release's tree, with a virtualenv of its own (built once, then reused)."""
    if not (REPOSITORY / ".git").exists():
        unavailable("needs the repository's history (git archive of the previous release): "
                    "run from a git checkout, or set DIO_REPOSITORY to one")
    tree, venv, stamp = HOME / "tree", HOME / "venv", HOME / ".installed"
    if not stamp.exists():
        shutil.rmtree(HOME, ignore_errors=True)
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", PREVIOUS], cwd=REPOSITORY, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        _run([sys.executable, "-m", "venv", str(venv)])
        # From its own pyproject.toml: the library with its extras, and what its
        # test app's web process needs of its test dependencies (the WSGI server,
        # requests for the payment gateway's client).
        group = tomllib.loads((tree / "pyproject.toml").read_text())["dependency-groups"]["test"]
        web = [r for r in group if r.split(">")[0].split("=")[0] in ("gunicorn", "requests")]
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
              "--disable-pip-version-check", f"{tree}[binary]", *web])
        stamp.touch()
    version = _run([str(venv / "bin" / "python"), "-c",
                    "import django_idempotency_outbox as d; print(d.__version__)"], cwd="/")
    assert version.strip() == "0.2.0"
    return HOME


def _env(**extra: str) -> dict[str, str]:
    """The suite's environment on the rolling database, in the plain mode, unpooled."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DIO_POOLED", "DIO_VERIFIED_CONTEXT", "PYTHONPATH")}
    return {**env, "DIO_TEST_DB": NAME, "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONUNBUFFERED": "1", **extra}


@pytest.fixture
def database() -> Iterator[None]:
    """A database migrated by this release's code, as its migrate leaves it before a deploy.

    A copy of the session's migrated template when there is one (tests/dbsetup.py):
    the same migrations' result; migrate then has nothing left to do but what lives
    outside the tables.
    """
    template = template_name()
    with psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{NAME}" WITH (FORCE)')
        copy = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                            [template]).fetchone() is not None
        conn.execute(f'CREATE DATABASE "{NAME}"' + (f' TEMPLATE "{template}"' if copy else ""))
    try:
        _run([sys.executable, "-m", "django", "migrate", "--database", "owner", "-v", "0"],
             cwd=ROOT, env=_env())
        yield
    finally:
        with psycopg.connect(owner_dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{NAME}" WITH (FORCE)')


class Web:
    """A web process of one release, gunicorn serving its tests.wsgi on the rolling database."""

    def __init__(self, python: Path | str, cwd: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = _env(PYTHONPATH=str(cwd))
        with open(log, "w") as sink:
            self.proc = subprocess.Popen(
                [str(python), "-m", "gunicorn", "tests.wsgi:application", "--bind",
                 f"127.0.0.1:{self.port}", "--workers", "1", "--threads", "4",
                 "--log-level", "warning"],
                cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, log.read_text()[-3000:]
            try:
                requests.get(self.url + "/scoped-orders/", timeout=5)
                return
            except (requests.ConnectionError, requests.Timeout):
                assert time.monotonic() < deadline, "gunicorn did not start within 60 s"
                time.sleep(0.2)

    def post(self, key: str, sku: str, user: str = "alice") -> requests.Response:
        return requests.post(self.url + "/published-orders/", json={"sku": sku, "quantity": 1},
                             headers={"X-User": user, "Idempotency-Key": key}, timeout=30)

    def orders(self, user: str) -> list[dict[str, object]]:
        answer = requests.get(self.url + "/scoped-orders/", headers={"X-User": user}, timeout=30)
        assert answer.status_code == 200, answer.text
        return list(answer.json())

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text()


def rows(sql: str) -> list[tuple[object, ...]]:
    """As the system role, which sees every tenant's rows."""
    system = settings.DATABASES[settings.TENANCY["SYSTEM_DATABASE"]]
    with psycopg.connect(host=system["HOST"], port=system["PORT"], user=system["USER"],
                         password=system["PASSWORD"], dbname=NAME) as conn:
        return conn.execute(sql).fetchall()


def test_a_web_process_of_the_previous_release_works_beside_this_ones(
    previous, database, tmp_path
):
    old = Web(previous / "venv" / "bin" / "python", previous / "tree", tmp_path / "old.log")
    new = Web(sys.executable, ROOT, tmp_path / "new.log")
    try:
        first = old.post("k-old", "tea")  # a keyed POST that publishes, on the old release
        assert first.status_code == 201, first.text
        assert old.post("k-old", "tea").headers.get("Idempotent-Replayed") == "true"
        retried = new.post("k-old", "tea")  # the client's retry reaches the new release
        assert retried.status_code == 201 and retried.headers["Idempotent-Replayed"] == "true"
        assert retried.json() == first.json()
        assert new.post("k-old", "coffee").status_code == 422  # reused for another request

        second = new.post("k-new", "coffee")  # and the other way round
        assert second.status_code == 201, second.text
        back = old.post("k-new", "coffee")
        assert back.status_code == 201 and back.headers["Idempotent-Replayed"] == "true"
        assert back.json() == second.json()

        mine = [o["id"] for o in old.orders("alice")]  # tenant-scoped GETs, either release
        assert mine == [o["id"] for o in new.orders("alice")]
        assert mine == [first.json()["id"], second.json()["id"]]
        assert old.orders("bob") == [] and new.orders("bob") == []
    finally:
        old_log, new_log = old.stop(), new.stop()
    assert "Traceback" not in old_log, old_log[-3000:]
    assert "Traceback" not in new_log, new_log[-3000:]

    published = rows("SELECT tenant_id, topic, payload->>'sku' FROM outbox_messages ORDER BY id")
    assert published == [(1, "order.placed", "tea"), (1, "order.placed", "coffee")]

    # Each release's relay delivers what both web processes published (a relay of
    # each, under names of their own: each has its own position).
    for python, cwd, pythonpath, name in (
            (str(previous / "venv" / "bin" / "python"), previous / "tree",
             str(previous / "tree"), "old"),
            (sys.executable, ROOT, None, "new")):
        relayed = _run([python, "-m", "django", "relay_outbox", "--once", "--name", name,
                        "--transport", "outbox.transports.LoggingTransport"], cwd=cwd,
                       env=_env(**({"PYTHONPATH": pythonpath} if pythonpath else {})))
        assert "2 message(s) sent" in relayed, relayed
