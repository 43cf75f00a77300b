"""docs/getting-started.md, followed as written, on a new project.

The test builds the wheel of this checkout, installs it with its
dependencies (from the package index) into a virtualenv of its own, and runs
the page's blocks in order, in a new directory:

- a ``python`` block whose first line is ``# path`` is written to that file;
  ``# path (at the end)`` is appended to it;
- a ``console`` block's ``$`` lines are run by bash (exported variables carry
  over to the next command, as in a terminal); the lines that follow a
  command are output it must print (``...`` stands for anything; for an HTTP
  answer, the status line and the headers shown must be there, and a JSON
  body shown must be the body);
- an HTML comment ``<!-- run: ... -->`` before a block says what else to do:
  ``as superuser`` or ``as owner`` (SQL), ``in the background`` (start each
  command and wait for its output), ``without celery`` (run at the end, after
  uninstalling Celery), ``warehouse up`` (start the fake warehouse of step
  8), ``not: <why>`` (skip it).

A block the test does not know how to run fails it, so an edit of the page
that breaks a step breaks the test. The page's names are mapped to unique
ones (roles, database, ports, Redis database); everything created is dropped
afterwards. Then the test checks what the page claims: a retry replays, a
merchant's list shows only its orders and another merchant's id is 404, the
deployment passes ``check --database``, the relay and the consumer ran (the
receipt was mailed once, the sales counted once), and the completer, a
process of its own, found the project's phases program.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from tests.live import ROOT, free_port

PAGE = ROOT / "docs" / "getting-started.md"

#: The page's names, mapped to names unique to one run. Roles are those the
#: page creates (``CREATE ROLE``), so a role added to the page is followed too.
ROLES = tuple(dict.fromkeys(re.findall(r"CREATE ROLE (\w+)", PAGE.read_text())))
PAGE_DATABASE = "shop"
PAGE_SERVER = ("localhost:8000", "127.0.0.1:8000")


@dataclass
class Block:
    language: str
    text: str
    marker: str  # what the <!-- run: ... --> comment before it says ("" if none)
    line: int  # where it starts in the page, for messages


def blocks(page: str) -> list[Block]:
    """The fenced blocks of the page, in order, each with its run marker."""
    found = []
    pattern = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.S | re.M)
    for match in pattern.finditer(page):
        before = page[: match.start()].rstrip().splitlines()
        marker = ""
        if before and (m := re.fullmatch(r"<!-- run: (.*?) -->", before[-1].strip())):
            marker = m.group(1)
        line = page[: match.start()].count("\n") + 1
        found.append(Block(match.group(1), match.group(2), marker, line))
    return found


def hooks(page: str) -> list[tuple[int, str]]:
    """``<!-- run: ... -->`` comments that stand alone (not before a block), by line."""
    found = []
    lines = page.splitlines()
    for number, text in enumerate(lines, start=1):
        if m := re.fullmatch(r"<!-- run: (.*?) -->", text.strip()):
            following = next((t for t in lines[number:] if t.strip()), "")
            if not following.startswith("```"):
                found.append((number, m.group(1)))
    return found


@dataclass
class Command:
    text: str
    output: list[str] = field(default_factory=list)


def commands(block: Block) -> list[Command]:
    """The ``$`` commands of a console block, with continuation lines and heredocs."""
    result: list[Command] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            text = line[2:]
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            if m := re.search(r"<<'?(\w+)'?", text):
                end = m.group(1)
                body = []
                while i + 1 < len(lines) and lines[i + 1] != end:
                    i += 1
                    body.append(lines[i])
                i += 1
                text = "\n".join([text, *body, end])
            result.append(Command(text))
        elif result:
            result[-1].output.append(line)
        else:
            raise AssertionError(f"getting-started.md:{block.line}: output before any command")
        i += 1
    return result


def shows(expected: str, actual_lines: list[str]) -> bool:
    """One shown output line is among the actual ones (``...`` matches anything)."""
    pattern = ".*".join(re.escape(part) for part in expected.strip().split("..."))
    return any(re.fullmatch(pattern, line.strip()) for line in actual_lines)


def check_output(command: Command, out: str) -> None:
    shown = [line for line in command.output if line.strip()]
    if not shown:
        return
    lines = [line.rstrip("\r") for line in out.splitlines()]
    if shown[0].startswith("HTTP/"):  # curl -si: status line, headers, body
        head, _, body = out.replace("\r\n", "\n").partition("\n\n")
        head_lines = head.splitlines()
        for line in shown:
            if line.startswith(("HTTP/", "{", "[")) or re.match(r"^[\w-]+: ", line):
                if line.startswith(("{", "[")):
                    assert json.loads(line) == json.loads(body), (command.text, body)
                else:
                    assert any(h.lower() == line.lower() for h in head_lines), (
                        f"{command.text}\nshould show {line!r}, shows:\n{head}"
                    )
        return
    for line in shown:
        assert shows(line, lines), f"{command.text}\nshould print {line!r}, printed:\n{out}"


class Warehouse:
    """The warehouse API of step 8: answers each shipment key with one shipment."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.shipments: dict[str, str] = {}
        self.calls = 0
        self.server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> None:
        warehouse = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the handler's own name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                warehouse.calls += 1
                key = self.headers["Idempotency-Key"]
                number = len(warehouse.shipments) + 1
                shipment = warehouse.shipments.setdefault(key, f"shp_{number}")
                body = json.dumps({"id": shipment}).encode()
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class Project:
    """A new project directory, its virtualenv, and the page's names made unique."""

    def __init__(self, tmp: Path) -> None:
        run = uuid.uuid4().hex[:8]
        self.dir = tmp / "project"
        self.dir.mkdir()
        self.venv = tmp / "venv"
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.roles = {role: f"gs{run}_{role}" for role in ROLES}
        self.database = f"gs{run}_db"
        self.password = uuid.uuid4().hex
        self.port = free_port()
        self.warehouse = Warehouse(free_port())
        redis = os.environ.get("DIO_REDIS_URL", "redis://127.0.0.1:6379/0")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("DJANGO_", "DIO_SUITE", "PYTHON", "VIRTUAL_ENV"))}
        env.update(
            PATH=f"{self.venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
            VIRTUAL_ENV=str(self.venv),
            PGHOST=os.environ.get("DIO_PGHOST", "127.0.0.1"),
            PGPORT=os.environ.get("DIO_PGPORT", "5432"),
            PGDATABASE=self.database,
            CELERY_BROKER_URL=re.sub(r"/\d*$", "/5", redis),  # a Redis database of its own
            WAREHOUSE_URL=f"http://127.0.0.1:{self.warehouse.port}",
            PYTHONUNBUFFERED="1",  # background commands' first lines reach their logs at once
        )
        for role in self.roles.values():
            env[f"{role.upper()}_PASSWORD"] = self.password
        self.env = env
        self.background: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.wheel: Path | None = None

    def rename(self, text: str) -> str:
        for page_role, role in self.roles.items():
            text = re.sub(rf"\b{page_role}\b", role, text)
        for address in PAGE_SERVER:
            text = text.replace(address, f"127.0.0.1:{self.port}")
        return text

    # --- the page's actions -------------------------------------------------------

    def write(self, block: Block) -> None:
        first, _, rest = block.text.partition("\n")
        m = re.fullmatch(r"# ([\w./-]+)( \(at the end\))?", first.strip())
        assert m, f"getting-started.md:{block.line}: a python block names its file first"
        path = self.dir / m.group(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = self.rename(rest)
        if m.group(2):
            assert path.exists(), f"getting-started.md:{block.line}: {m.group(1)} does not exist"
            text = path.read_text() + "\n\n" + text
        path.write_text(text)

    def superuser(self, dbname: str) -> psycopg.Connection:
        return psycopg.connect(host=os.environ["DIO_PGSOCKET"], port=os.environ["DIO_PGPORT"],
                               user="postgres", dbname=dbname, autocommit=True)

    def sql(self, block: Block) -> None:
        text = self.rename(block.text).replace("'...'", f"'{self.password}'")
        text = re.sub(rf"(CREATE DATABASE )\b{PAGE_DATABASE}\b", rf"\g<1>{self.database}", text)
        chunks = re.split(r";[ \t]*(?:--[^\n]*)?$", text, flags=re.M)
        statements = [c.strip() for c in chunks if re.sub(r"--[^\n]*", "", c).strip()]
        if block.marker == "as superuser":
            with self.superuser("postgres") as conn:
                for statement in statements:
                    conn.execute(statement)
        elif block.marker == "as owner":
            owner = self.roles["shop_owner"]  # the role the page's CREATE DATABASE names
            with psycopg.connect(host=self.env["PGHOST"], port=self.env["PGPORT"], user=owner,
                                 password=self.password, dbname=self.database,
                                 autocommit=True) as conn:
                for statement in statements:
                    conn.execute(statement)
        else:
            raise AssertionError(f"getting-started.md:{block.line}: who runs this SQL?")

    def shell(self, text: str, timeout: float = 300) -> str:
        """Run one command in bash; exported variables carry over to the next one."""
        env_file = self.logs / "env"
        script = f"{text}\nstatus=$?\nenv -0 > {env_file}\nexit $status\n"
        done = subprocess.run(["bash", "-c", script], cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"$ {text}\nexited {done.returncode}:\n{out[-4000:]}"
        if env_file.exists():
            self.env = dict(
                item.split("=", 1) for item in env_file.read_text().split("\0") if "=" in item
            )
        return done.stdout if done.stdout.strip() else out

    def console(self, block: Block) -> None:
        for command in commands(block):
            text = self.rename(command.text)
            if text.startswith("runserver") or " runserver" in text:
                text = re.sub(r"\brunserver\b(?!\s+\S*:\d)", f"runserver 127.0.0.1:{self.port}",
                              text)
            if block.marker == "in the background":
                self.start(text, [self.rename(line) for line in command.output])
                continue
            text = text.replace(
                '"django-idempotency-outbox[', f'"{self.wheel}['
            ).replace('"django-idempotency-outbox"', f'"{self.wheel}"')
            command.output = [self.rename(line) for line in command.output]
            check_output(command, self.shell(text))

    def start(self, text: str, output: list[str]) -> None:
        log = self.logs / f"background-{len(self.background)}.log"
        with open(log, "wb") as sink:
            proc = subprocess.Popen(["bash", "-c", f"exec {text}"], cwd=self.dir, env=self.env,
                                    stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.background.append((text, proc, log))
        deadline = time.monotonic() + 90
        while True:
            printed = log.read_text(errors="replace").splitlines()
            if all(shows(line, printed) for line in output if line.strip()):
                return
            assert proc.poll() is None, f"$ {text}\nexited:\n" + "\n".join(printed[-40:])
            assert time.monotonic() < deadline, f"$ {text}\nprinted:\n" + "\n".join(printed[-40:])
            time.sleep(0.2)

    def stop_background(self) -> None:
        for _, proc, _ in reversed(self.background):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc, _ in self.background:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def drop(self) -> None:
        with self.superuser("postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            for role in self.roles.values():
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')

    def log(self, index: int) -> str:
        return self.background[index][2].read_text(errors="replace")


@pytest.fixture
def project(tmp_path):
    project = Project(tmp_path)
    try:
        yield project
    finally:
        project.stop_background()
        project.warehouse.stop()
        project.drop()


def build_wheel(into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(into),
                    str(ROOT)], check=True, capture_output=True, timeout=600)
    [wheel] = into.glob("django_idempotency_outbox-*.whl")
    return wheel


def test_the_getting_started_page_works_as_written(project, tmp_path):
    started = time.monotonic()
    page = PAGE.read_text()
    assert "shop_owner" in ROLES and "shop_app" in ROLES, ROLES
    for page_name in (f"CREATE DATABASE {PAGE_DATABASE} ", *PAGE_SERVER[:1]):
        assert page_name in page, f"the page no longer says {page_name!r}: update this test"
    project.wheel = build_wheel(tmp_path / "dist")
    subprocess.run([sys.executable, "-m", "venv", str(project.venv)], check=True, timeout=120)

    later: list[Block] = []
    hook_lines = dict(hooks(page))
    done_hooks: set[int] = set()
    for block in blocks(page):
        for line, hook in hook_lines.items():  # stand-alone hooks placed before this block
            if line < block.line and line not in done_hooks:
                done_hooks.add(line)
                assert hook == "warehouse up", f"getting-started.md:{line}: unknown {hook!r}"
                project.warehouse.start()
        if block.marker.startswith("not:"):
            continue
        if block.marker == "without celery":
            later.append(block)
        elif block.language == "python":
            project.write(block)
        elif block.language == "sql":
            project.sql(block)
        elif block.language == "console":
            project.console(block)
        else:
            raise AssertionError(f"getting-started.md:{block.line}: no rule for {block.language!r}")
    assert len(done_hooks) == len(hook_lines)

    # What the page claims, checked from outside.
    import requests

    base = f"http://127.0.0.1:{project.port}"
    alice = {"Authorization": f"Token {project.env['ALICE']}"}
    bob = {"Authorization": f"Token {project.env['BOB']}"}
    body = {"sku": "cake", "quantity": 1}
    first = requests.post(f"{base}/orders/", json=body, timeout=30,
                          headers={**alice, "Idempotency-Key": "check-1"})
    again = requests.post(f"{base}/orders/", json=body, timeout=30,
                          headers={**alice, "Idempotency-Key": "check-1"})
    assert first.status_code == again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert [o["sku"] for o in requests.get(f"{base}/orders/", headers=alice, timeout=30).json()
            ] == ["tea", "cake"]
    assert [o["sku"] for o in requests.get(f"{base}/orders/", headers=bob, timeout=30).json()
            ] == ["rice"]
    assert requests.get(f"{base}/orders/1/", headers=bob, timeout=30).status_code == 404
    assert project.warehouse.calls == 1 and len(project.warehouse.shipments) == 1

    checked = project.shell("python manage.py check --database default --database system")
    assert "System check identified no issues (0 silenced)." in checked

    def counted() -> tuple[int, int]:
        with project.superuser(project.database) as conn:
            sales = conn.execute("SELECT tenant_id, sum(orders) FROM shop_dailysales"
                                 " GROUP BY tenant_id ORDER BY 1").fetchall()
            relayed = conn.execute("SELECT count(*) FROM outbox_received").fetchone()[0]
        return sales, relayed

    deadline = time.monotonic() + 60
    while counted() != ([(1, 2), (2, 1)], 3) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert counted() == ([(1, 2), (2, 1)], 3)  # three orders, each counted and mailed once
    worker = project.log(1)
    assert worker.count("Order 1 is confirmed.") == 1, worker[-3000:]

    # Without Celery, as the page's variant says: consumers still run.
    project.stop_background()
    project.shell("pip uninstall -y -q celery")
    for block in later:
        project.write(block)
    assert "no issues" in project.shell(
        "python manage.py check --database default --database system")
    project.shell("python manage.py run_consumers --once")
    print(f"getting-started followed in {time.monotonic() - started:.0f} s")
