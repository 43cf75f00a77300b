"""docs/getting-started.md and its follow-on pages, followed as written, on a new project.

The wheel is the one ``make dist`` builds (``make dist DIST=<directory>``), put
where the page's step 1 says and installed by the page's own ``pip install``
line, with its dependencies from the package index, into a new virtualenv,
which the module's tests share: each runs the line again (a no-op unless a
page removed something). Each page's blocks run in order, in a new directory:

- a ``python`` or ``ini`` block whose first line is ``# path`` is written to
  that file; ``# path (at the end)`` is appended to it;
- a ``console`` block's ``$`` lines are run by bash (exported variables carry
  over to the next command, as in a terminal); the lines that follow a
  command are output it must print (``...`` stands for anything; for an HTTP
  answer, the status line and the headers shown must be there, and a JSON
  body shown must be the body);
- an HTML comment ``<!-- run: ... -->`` before a block says what else to do:
  ``in the background`` (start each command and wait for its output),
  ``without celery`` (run at the end, after uninstalling Celery), ``not:
  <why>`` (skip it).

A block the test does not know how to run fails it, so an edit of a page
that breaks a step breaks the test. The pages run as a reader on another
machine would follow them: as the user running the tests (root, in CI, where
a page says nothing of root; a command's ``# as root: ...`` comment is what
root runs instead), against a PostgreSQL that does not listen on 5432, named
by ``DATABASE_URL`` as the getting started page says, with the superuser's
password where a page says ``PGPASSWORD=...`` (the test gives ``postgres``
one for the while). Only names are made unique (the database, and with it
the roles ``databases()`` derives from it; the web server's and pgbouncer's
ports, and the one line of ``pgbouncer.ini`` the page says is the reader's
server); everything created is dropped afterwards.
The follow-on pages each continue the getting started page's project, as a
reader would; the background processes of a page are stopped before the
next one starts.

Then the test checks what the pages claim from outside, and goes on the
way a user does: a second tenant-isolated model and a plain one,
``makemigrations``, ``migrate``, ``check`` on every alias, the new table
isolated for the app role; every command a developer runs (makemigrations,
migrate, showmigrations, check, the test runner, dbshell) through every
alias, with the default layout and with the app's alias not named
``default``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from django_idempotency_outbox import __version__
from tests.helpers import unavailable
from tests.live import ROOT, free_port

DOCS = ROOT / "docs"
PAGE = DOCS / "getting-started.md"
WHEEL = f"django_idempotency_outbox-{__version__}-py3-none-any.whl"
PAGE_DATABASE = "shop"
PAGE_SERVER = ("localhost:8000", "127.0.0.1:8000")
PAGE_WAREHOUSE = "127.0.0.1:8100"
KINDS = ("owner", "app", "worker", "system")
#: What a page puts where the reader types the PostgreSQL superuser's password.
PAGE_PASSWORD = "PGPASSWORD=..."


@dataclass
class Block:
    language: str
    text: str
    marker: str  # what the <!-- run: ... --> comment before it says ("" if none)
    line: int  # where it starts in the page, for messages
    page: str = ""


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of the page, in order, each with its run marker."""
    text = page.read_text()
    found = []
    pattern = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.S | re.M)
    for match in pattern.finditer(text):
        before = text[: match.start()].rstrip().splitlines()
        marker = ""
        if before and (m := re.fullmatch(r"<!-- run: (.*?) -->", before[-1].strip())):
            marker = m.group(1)
        line = text[: match.start()].count("\n") + 1
        found.append(Block(match.group(1), match.group(2), marker, line, page.name))
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
            raise AssertionError(f"{block.page}:{block.line}: output before any command")
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
                if line.startswith(("{", "[")) and "..." in line:  # a value left open
                    compact = json.dumps(json.loads(body), separators=(",", ":"))
                    assert shows(line, [compact]), (command.text, body)
                elif line.startswith(("{", "[")):
                    assert json.loads(line) == json.loads(body), (command.text, body)
                else:
                    assert any(h.lower() == line.lower() for h in head_lines), (
                        f"{command.text}\nshould show {line!r}, shows:\n{head}"
                    )
        return
    for line in shown:
        assert shows(line, lines), f"{command.text}\nshould print {line!r}, printed:\n{out}"


class Project:
    """A new project directory, its virtualenv, and the pages' names made unique."""

    def __init__(self, tmp: Path, dist: Path, venv: Path) -> None:
        run = uuid.uuid4().hex[:8]
        self.dir = tmp / "project"
        self.dir.mkdir()
        self.venv = venv
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.dist = dist
        self.database = f"gs{run}_{PAGE_DATABASE}"
        self.roles = {kind: f"{self.database}_{kind}" for kind in KINDS}
        self.port = free_port()
        self.pgbouncer_port = free_port()
        self.warehouse_port = free_port()
        self.pgport = os.environ.get("DIO_PGPORT", "5432")
        assert self.pgport != "5432", "the pages are followed on a server not on 5432"
        self.socket = os.environ["DIO_PGSOCKET"]
        self.superuser_password = f"su-{run}"
        redis = os.environ.get("DIO_REDIS_URL", "redis://127.0.0.1:6379/0")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("DJANGO_", "DIO_SUITE", "PYTHON", "VIRTUAL_ENV", "PG"))}
        env.update(
            PATH=f"{self.venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}:/usr/sbin",
            VIRTUAL_ENV=str(self.venv),
            # What getting started asks of a reader whose server is not on localhost:5432.
            DATABASE_URL=f"postgres://localhost:{self.pgport}/{self.database}",
            # ...and of one whose port 6432 is taken (the pgbouncer page's settings).
            POOLED_URL=f"postgres://localhost:{self.pgbouncer_port}/{self.database}",
            CELERY_BROKER_URL=re.sub(r"/\d*$", "/5", redis),  # a Redis database of its own
            WAREHOUSE_URL=f"http://127.0.0.1:{self.warehouse_port}",
            PYTHONUNBUFFERED="1",  # background commands' first lines reach their logs at once
        )
        self.env = env
        self.background: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.later: list[Block] = []

    def rename(self, text: str) -> str:
        """The pages' names made this run's; the reader's own server where a page says so."""
        text = re.sub(rf"\b{PAGE_DATABASE}_({'|'.join(KINDS)})\b", rf"{self.database}_\1", text)
        text = re.sub(rf"(localhost:\d+)/{PAGE_DATABASE}\b", rf"\1/{self.database}", text)
        text = text.replace(f"database {PAGE_DATABASE}:", f"database {self.database}:")
        # pgbouncer.ini: the one line the page says holds the reader's server, and a free port
        text = re.sub(rf"^{PAGE_DATABASE} = host=localhost port=5432 dbname={PAGE_DATABASE}$",
                      f"{self.database} = host=localhost port={self.pgport} "
                      f"dbname={self.database}", text, flags=re.M)
        text = text.replace("listen_port = 6432", f"listen_port = {self.pgbouncer_port}")
        text = text.replace(PAGE_PASSWORD, f"PGPASSWORD='{self.superuser_password}'")
        for address in PAGE_SERVER:
            text = text.replace(address, f"127.0.0.1:{self.port}")
        return text.replace(PAGE_WAREHOUSE, f"127.0.0.1:{self.warehouse_port}")

    # --- the pages' actions -------------------------------------------------------

    def follow(self, page: Path, stop: bool = True) -> None:
        for block in blocks(page):
            if block.marker.startswith("not:"):
                continue
            if block.marker == "without celery":
                self.later.append(block)
            elif block.language in ("python", "ini"):
                self.write(block)
            elif block.language == "console":
                self.console(block)
            else:
                raise AssertionError(f"{block.page}:{block.line}: no rule for {block.language!r}")
        if stop:
            self.stop_background()

    def write(self, block: Block) -> None:
        first, _, rest = block.text.partition("\n")
        m = re.fullmatch(r"# ([\w./-]+)( \(at the end\))?", first.strip())
        assert m, f"{block.page}:{block.line}: a {block.language} block names its file first"
        path = self.dir / m.group(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = self.rename(rest)
        if m.group(2):
            assert path.exists(), f"{block.page}:{block.line}: {m.group(1)} does not exist"
            text = path.read_text() + "\n\n" + text
        path.write_text(text)

    def shell(self, text: str, timeout: float = 600, check: bool = True) -> str:
        """Run one command in bash; exported variables carry over to the next one."""
        env_file = self.logs / "env"
        script = f"{text}\nstatus=$?\nenv -0 > {env_file}\nexit $status\n"
        done = subprocess.run(["bash", "-c", script], cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        out = done.stdout + done.stderr
        assert done.returncode == 0 or not check, (
            f"$ {text}\nexited {done.returncode}:\n{out[-4000:]}")
        if env_file.exists():
            self.env = dict(
                item.split("=", 1) for item in env_file.read_text().split("\0") if "=" in item
            )
        return out

    def console(self, block: Block) -> None:
        for command in commands(block):
            text = self.rename(as_this_user(command.text))
            if re.search(r"\brunserver\b(?!\s+\S*:\d)", text):
                text = re.sub(r"\brunserver\b", f"runserver 127.0.0.1:{self.port}", text)
            output = [self.rename(line) for line in command.output]
            if block.marker == "in the background":
                self.start(text, output)
                continue
            command.output = output
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

    def log(self, command: str) -> str:
        """What the background command that starts with ``command`` printed."""
        for text, _, log in self.background:
            if command in text:
                return log.read_text(errors="replace")
        raise AssertionError(f"no background command {command!r}")

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
        self.finished, self.background = self.background, []

    def superuser(self, dbname: str | None = None) -> psycopg.Connection:
        return psycopg.connect(host=self.socket, port=self.pgport, user="postgres",
                               dbname=dbname or self.database, autocommit=True)

    def give_the_superuser_a_password(self) -> None:
        """What the pages' ``PGPASSWORD=...`` stands for: ``postgres`` logs in over TCP with it.

        The test cluster's ``postgres`` has none (it is reached through the socket);
        whatever it had is put back by :meth:`drop`.
        """
        with self.superuser("postgres") as conn:
            self.previous_password = conn.execute(
                "SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'").fetchone()[0]
            conn.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(
                self.superuser_password))

    def drop(self) -> None:
        with self.superuser("postgres") as conn:
            for name in (self.database, f"test_{self.database}"):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            for role in self.roles.values():
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')
            if hasattr(self, "previous_password"):
                conn.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(
                    self.previous_password))


def as_this_user(text: str) -> str:
    """A command as the user running the tests types it: its ``# as root:`` form as root."""
    command, _, root = text.partition("  # as root: ")
    if not root:
        return text
    return root.strip() if os.geteuid() == 0 else command.rstrip()


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and wheel of this checkout, as ``make dist`` builds and checks them.

    ``DIO_DIST`` names a directory ``make dist`` already filled from this
    checkout (CI builds the packages once, then runs the suite): its wheel is
    used as it is.
    """
    built = os.environ.get("DIO_DIST")
    if built:
        where = Path(built).resolve()
        assert (where / WHEEL).exists(), f"DIO_DIST={built} holds no {WHEEL}"
        return where
    where = tmp_path_factory.mktemp("dist")
    # The virtualenv running the tests builds it (its packaging tools are make's to install),
    # also from a copy of the checkout that has none (make mutants).
    done = subprocess.run(["make", "-s", "dist", f"DIST={where}", f"VENV={sys.prefix}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (where / WHEEL).exists(), sorted(p.name for p in where.iterdir())
    return where


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """The virtualenv the pages' tests share (installing into a new one took each about
    ten seconds). The first test, getting started's, installs into it new; each later
    one runs the page's ``pip install`` line again, which puts back anything a page
    removed (the events page uninstalls Celery) and finds what an earlier page added
    (the Celery extra's dependencies)."""
    return tmp_path_factory.mktemp("gs") / "venv"


@pytest.fixture
def project(tmp_path, dist, venv):
    made = Project(tmp_path, dist, venv)
    try:
        made.give_the_superuser_a_password()
        yield made
    finally:
        made.stop_background()
        made.drop()


def getting_started(project: Project) -> None:
    """Step 1 says where the wheel goes; the rest is the page, as written."""
    assert f"`{WHEEL}`" in PAGE.read_text(), f"the page should name {WHEEL}"
    shutil.copy(project.dist / WHEEL, project.dir / WHEEL)
    if not (project.venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(project.venv)], check=True,
                       timeout=120)
    project.follow(PAGE)


def test_the_getting_started_page_works_as_written_and_past_it(project):
    started = time.monotonic()
    getting_started(project)
    print(f"getting-started followed in {time.monotonic() - started:.0f} s")

    # What the page claims, checked from outside: the roles as the design wants them...
    with project.superuser() as conn:
        attributes = {name: (superuser, bypassrls) for name, superuser, bypassrls in conn.execute(
            "SELECT rolname, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = ANY(%s)",
            [list(project.roles.values())]).fetchall()}
        owner = conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database"
                             " WHERE datname = current_database()").fetchone()[0]
    assert attributes[project.roles["app"]] == attributes[project.roles["worker"]] == (
        False, False)
    assert attributes[project.roles["system"]] == (False, True)
    assert owner == project.roles["owner"]
    # ...and running the roles command again changes nothing.
    again = project.shell(project.rename(f"{PAGE_PASSWORD} python manage.py create_roles"))
    assert again.strip().endswith("nothing to change"), again
    # A reader who exported the superuser's password is told why every alias fails.
    exported = project.shell(project.rename(
        f"export {PAGE_PASSWORD}; python manage.py check --database default; unset PGPASSWORD"),
        check=False)
    assert "password authentication failed" in exported, exported
    assert "tenancy.W049" in exported and "unset PGPASSWORD" in exported, exported

    # The page's Refund refers to an order of its own merchant only (its own test says so
    # too), and another merchant's order is refused exactly as one that does not exist.
    references = project.shell("""python manage.py shell <<'EOF'
from django.db import IntegrityError
from tenancy import tenant_context
from shop.models import Order, Refund
with tenant_context(1):
    order = Order.objects.create(tenant_id=1, sku="tea", quantity=1)
for label, order_id in [("foreign", order.pk), ("missing", order.pk + 1000)]:
    try:
        with tenant_context(2):
            Refund.objects.create(tenant_id=2, order_id=order_id, amount=1)
    except IntegrityError as exc:
        print(label, " ".join(str(exc).replace(str(order_id), "#").split()))
EOF""")
    refusals = dict(line.split(" ", 1) for line in references.splitlines()
                    if line.startswith(("foreign ", "missing ")))
    assert refusals.keys() == {"foreign", "missing"}, references
    assert refusals["foreign"] == refusals["missing"], refusals
    assert "violates foreign key constraint" in refusals["foreign"]
    with project.superuser() as conn:
        assert conn.execute("SELECT count(*) FROM shop_refund").fetchone() == (0,)
        conn.execute("DELETE FROM shop_order WHERE sku = 'tea' AND quantity = 1")

    # The way a user goes on: a plain model next to the tenant-isolated ones.
    (project.dir / "shop" / "models.py").write_text(
        (project.dir / "shop" / "models.py").read_text() + '''

class Product(models.Model):
    sku = models.CharField(max_length=50)
''')
    # ...which holds no merchant's rows: opened to the web process, as a user says so.
    (project.dir / "shop" / "settings.py").write_text(
        (project.dir / "shop" / "settings.py").read_text()
        + '\nTENANCY["SHARED_TABLES"] = [*TENANCY["SHARED_TABLES"], "shop_product"]\n')
    # ...and a test that commits, which Django flushes after it (through the owner).
    (project.dir / "shop" / "tests.py").write_text(
        (project.dir / "shop" / "tests.py").read_text() + """

class RefundsCommit(TransactionTestCase):
    def test_a_refund_commits(self):
        with tenant_context(1):
            order = Order.objects.create(tenant_id=1, sku="tea", quantity=1)
            Refund.objects.create(tenant_id=1, order=order, amount=5)
        with tenant_context(1):
            self.assertEqual(Refund.objects.count(), 1)

    def test_and_the_next_test_starts_empty(self):
        with tenant_context(1):
            self.assertEqual(Refund.objects.count(), 0)
            self.assertEqual(Order.objects.count(), 0)


class EveryAlias(TransactionTestCase):
    from django.conf import settings as _settings

    databases = {_settings.TENANCY.get("APP_DATABASE", "default"), "worker", "system", "owner"}

    def test_every_alias_reaches_the_one_test_database(self):
        from django.db import connections

        names = {alias: connections[alias].settings_dict["NAME"] for alias in self.databases}
        self.assertEqual(len(set(names.values())), 1, names)
        self.assertTrue(names["owner"].startswith("test_"), names)
        with tenant_context(1, using="worker"):
            order = Order.objects.using("worker").create(tenant_id=1, sku="tea", quantity=1)
            Refund.objects.using("worker").create(tenant_id=1, order=order, amount=7)
""")
    made = project.shell("python manage.py makemigrations shop")
    assert "Create model Product" in made and "Refund" not in made
    project.shell("python manage.py migrate --database owner")
    aliases = ("default", "worker", "system", "owner")
    every_command_through_every_alias(project, aliases, tests="shop")
    with project.superuser() as conn:
        rls = conn.execute(
            "SELECT relname, relrowsecurity, relforcerowsecurity,"
            " (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid)"
            " FROM pg_class c WHERE relname IN ('shop_refund', 'shop_product') ORDER BY 1"
        ).fetchall()
    assert rls == [("shop_product", False, False, 0), ("shop_refund", True, True, 1)]
    isolated = project.shell("""python manage.py shell <<'EOF'
from django.db import DatabaseError, transaction
from tenancy import tenant_context
from shop.models import Order, Product, Refund
with tenant_context(1):
    order = Order.objects.create(tenant_id=1, sku="tea", quantity=1)
    Refund.objects.create(tenant_id=1, order=order, amount=5)
with tenant_context(2):
    print("tenant 2 sees", Refund.objects.count())
    try:
        with transaction.atomic():
            Refund.objects.create(tenant_id=1, order=order, amount=6)
    except DatabaseError as exc:
        print("refused:", str(exc).splitlines()[0])
print("no tenant sees", Refund.objects.count())
Product.objects.create(sku="tea")
print("products", Product.objects.count())
EOF""")
    assert "tenant 2 sees 0" in isolated
    assert 'refused: new row violates row-level security policy for table "shop_refund"' in (
        isolated)
    assert "no tenant sees 0" in isolated and "products 1" in isolated

    # The same commands with the app's alias not named "default" (docs/settings.md).
    settings = project.dir / "shop" / "settings.py"
    settings.write_text(settings.read_text() + project.rename('''
DATABASES = databases(os.environ.get("DATABASE_URL", "postgres://localhost:5432/shop"),
                      passfile=BASE_DIR / ".pgpass", aliases={"app": "app"})
TENANCY["APP_DATABASE"] = "app"
'''))
    (project.dir / "shop" / "tests.py").write_text(
        (project.dir / "shop" / "tests.py").read_text().replace(
            "(TestCase):\n", '(TestCase):\n    databases = {"app"}\n\n').replace(
            "(TransactionTestCase):\n", '(TransactionTestCase):\n    databases = {"app"}\n\n'))
    every_command_through_every_alias(project, ("app", "worker", "system", "owner"),
                                      tests="shop")


def every_command_through_every_alias(project: Project, aliases: tuple[str, ...],
                                      tests: str) -> None:
    """makemigrations, migrate, showmigrations, check, the test runner, dbshell."""
    assert "No changes detected" in project.shell("python manage.py makemigrations --check")
    assert "No migrations to apply." in project.shell("python manage.py migrate --database owner")
    app, worker, system, _ = aliases
    checked = project.shell(f"python manage.py check --database {app} --database {worker}"
                            f" --database {system} --database owner")
    assert "System check identified no issues (0 silenced)." in checked
    for alias, kind in zip(aliases, ("app", "worker", "system", "owner"), strict=True):
        shown = project.shell(f"python manage.py showmigrations shop --database {alias}")
        assert "[X] 0001_initial" in shown
        assert "System check identified no issues" in project.shell(
            f"python manage.py check --database {alias}")
        who = project.shell(f"echo 'SELECT current_user;' | python manage.py dbshell"
                            f" --database {alias}")
        assert project.roles[kind] in who, who
    with project.superuser() as conn:  # a row of the real database's, which the tests must keep
        conn.execute("INSERT INTO shop_product (sku) VALUES ('sentinel')")
    ran = project.shell(f"python manage.py test {tests}")
    assert re.search(r"^OK$", ran, re.M) and "Ran 5 tests" in ran, ran
    assert "Error" not in ran and "Traceback" not in ran, ran
    with project.superuser() as conn:  # the real database is still there, data and all
        assert conn.execute("DELETE FROM shop_product WHERE sku = 'sentinel'").rowcount == 1
        assert conn.execute("SELECT count(*) FROM pg_database WHERE datname LIKE 'test_%'"
                            ).fetchone()[0] == 0


def explained(log: str, page: Path) -> list[str]:
    """The warnings in ``log`` the page does not explain (by their id, or Celery's words).

    A warning is a Python warning, a WARNING of the worker's main process, or one
    of the library's loggers; not what a task prints (Celery logs a task's stdout,
    the console mail backend's mail here, as WARNING lines of its pool process).
    """
    text = page.read_text()
    unexplained = []
    for line in log.splitlines():
        if not re.search(r"Warning:|WARNING/MainProcess\]|"
                         r"WARNING\S*\] (outbox|tenancy|idempotency)\b|^WARNING", line):
            continue
        ids = re.findall(r"\b(?:outbox|tenancy|idempotency)\.[EW]\d{3}\b", line)
        if ids:
            if not all(i in text for i in ids):
                unexplained.append(line)
        elif "superuser privileges" in line:
            if "superuser privileges" not in text:
                unexplained.append(line)
        else:
            unexplained.append(line)
    return unexplained


def test_the_events_page_works_as_written(project, tmp_path):
    # Redis as it comes: no append-only file (the suite's own keeps one).
    from tests.outbox.support.rig import RedisServer

    redis = RedisServer(tmp_path / "redis", persistent=False).start()
    project.env["CELERY_BROKER_URL"] = redis.url
    try:
        events_page(project)
    finally:
        project.stop_background()
        redis.stop()


def events_page(project: Project) -> None:
    getting_started(project)
    project.follow(DOCS / "getting-started-events.md", stop=False)

    def counted() -> list[tuple[int, int]]:
        with project.superuser() as conn:
            return conn.execute("SELECT tenant_id, sum(orders) FROM shop_dailysales"
                                " GROUP BY tenant_id ORDER BY 1").fetchall()

    deadline = time.monotonic() + 60
    while (counted() != [(1, 1)] or "Order 3 is confirmed." not in project.log("celery")) and (
            time.monotonic() < deadline):
        time.sleep(0.3)
    assert counted() == [(1, 1)]  # the consumer counted the order once, for merchant 1
    assert project.log("celery").count("Order 3 is confirmed.") == 1, project.log("celery")[-3000:]
    # What the worker warns about, a reader finds on the page: W105 with Redis's default
    # configuration, Celery's superuser warning as root.
    page = DOCS / "getting-started-events.md"
    celery_log = project.log("celery")
    assert "outbox.W105" in celery_log, celery_log[-3000:]
    if os.geteuid() == 0:
        assert "superuser privileges" in celery_log, celery_log[-3000:]
    assert explained(celery_log, page) == []
    for command in ("relay_outbox", "run_consumers"):
        assert explained(project.log(command), page) == [], command
    project.stop_background()

    # Without Celery, as the page's variant says: consumers still run.
    project.shell("pip uninstall -y -q celery")
    for block in project.later:
        project.write(block)
    assert "no issues" in project.shell(
        "python manage.py check --database default --database worker --database system")
    project.shell("python manage.py run_consumers --once")


def test_the_phases_page_works_as_written(project):
    getting_started(project)
    project.follow(DOCS / "getting-started-phases.md")
    warehouse = next(log.read_text() for text, _, log in project.finished
                     if "warehouse.py" in text)
    assert len(re.findall(r"^shipment shp_1 for key ", warehouse, re.M)) == 1, warehouse
    # The client's 503 said nothing of the network (the page's block checks its body); the
    # refused connection's text went to runserver's log, as the page says.
    server = next(log.read_text() for text, _, log in project.finished if "runserver" in text)
    assert re.search(r"warehouse call failed: .*(refused|Errno)", server), server[-3000:]
    with project.superuser() as conn:
        assert conn.execute("SELECT tenant_id, order_id, warehouse_id FROM shop_shipment"
                            ).fetchall() == [(1, 1, "shp_1")]


@pytest.fixture
def pgbouncer_installed():
    if not Path("/usr/sbin/pgbouncer").exists() and not shutil.which("pgbouncer"):
        unavailable("pgbouncer is not installed (Debian's package pgbouncer)")


def test_the_pgbouncer_page_works_as_written(pgbouncer_installed, project):
    getting_started(project)
    project.follow(DOCS / "getting-started-pgbouncer.md")
    pgbouncer = next(log.read_text() for text, _, log in project.finished
                     if "pgbouncer" in text)
    # The web process's requests went through it, as the app role.
    assert re.search(rf"{project.database}/{project.roles['app']}@", pgbouncer), pgbouncer[-3000:]
    # The SCRAM secret it read is the reader's alone, as the page says.
    assert (project.dir / "userlist.txt").stat().st_mode & 0o077 == 0
    assert (project.dir / "userlist.txt").read_text().startswith(
        f'"{project.roles["app"]}" "SCRAM-SHA-256$')
