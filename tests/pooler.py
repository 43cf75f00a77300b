"""A private pgbouncer whose pools hold one server session each, and aliases routed through it.

Behind a transaction pooler, the next borrower of a server session may be
another tenant's request. With ``pool_size = 1`` every client of a role
borrows the *same* server session, so a test can leave something in it as
one borrower and watch what the next one (the library's own flows) makes of
it. Every run of the tests runs these (``make test``, ``make test-variants``...):
they need pgbouncer's binary, ``/usr/sbin/pgbouncer``, not a running pgbouncer.
``scripts/services`` installs it (Debian's package) whenever it starts PostgreSQL
as root, as ``make test`` does on a fresh machine; run as any other user, these
tests fail and name the command that installs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.db import connections

PGBOUNCER = "/usr/sbin/pgbouncer"


def _die_with_parent() -> None:
    """In the child, before pgbouncer starts: SIGTERM it when the tests' process dies.

    A test run killed outright runs no ``finally``; the pooler must not outlive it.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def connection_settings(alias: str, **values: Any) -> Iterator[None]:
    """Django's ``alias`` connects with ``values`` in its settings while the block runs.

    Its connection is closed before and after, so that each side connects anew.
    """
    connection = connections[alias]
    connection.close()
    saved = dict(connection.settings_dict)
    connection.settings_dict.update(values)
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


class Pooler:
    """A running private pgbouncer: transaction pooling, one server session per pool."""

    def __init__(self, port: int, start: Callable[[], subprocess.Popen[bytes]] | None = None
                 ) -> None:
        self.port = port
        self._start = start
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (again), on its port, and wait until it takes clients."""
        assert self._start is not None
        self.process = process = self._start()
        deadline = time.monotonic() + 10
        while True:
            try:
                self.connect().close()
                return
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the private pgbouncer did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM: pgbouncer exits at once, closing its clients' and its server connections."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> None:
        """What a client sees of a pooler restarted: its connection closed under it."""
        self.stop()
        self.start()

    def connect(self, alias: str = "default", **kwargs: Any) -> psycopg.Connection:
        """A client of the pooler as the role of ``alias`` (autocommit unless told)."""
        db = settings.DATABASES[alias]
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user=db["USER"], password=db["PASSWORD"],
            dbname=db["NAME"], prepare_threshold=None, **{"autocommit": True, **kwargs},
        )

    def leave(self, alias: str, *sql: str) -> None:
        """Run ``sql`` as one borrower of ``alias``'s server session, then hang up.

        What the statements leave in the session stays there for the next
        borrower, but for session-level settings: pgbouncer runs ``RESET ALL``
        on the session before it lends it again (``server_reset_query``, as
        docs/scaling.md configures it).
        """
        with self.connect(alias) as conn:
            for statement in sql:
                conn.execute(statement)

    @contextlib.contextmanager
    def routed(self, *aliases: str) -> Iterator[None]:
        """Django's ``aliases`` connect through this pooler while the block runs.

        With the options docs/scaling.md asks of a pooled alias, and persistent
        client connections, as deployed.
        """
        with contextlib.ExitStack() as stack:
            for alias in aliases:
                options = connections[alias].settings_dict.get("OPTIONS", {})
                stack.enter_context(connection_settings(
                    alias, HOST="127.0.0.1", PORT=str(self.port), CONN_MAX_AGE=None,
                    CONN_HEALTH_CHECKS=True, DISABLE_SERVER_SIDE_CURSORS=True,
                    OPTIONS={**options, "prepare_threshold": None},
                ))
            yield

    @contextlib.contextmanager
    def through(self, alias: str, *, declared: bool) -> Iterator[None]:
        """``alias`` connects through this pooler, declared pooled in its settings or not.

        Declared: :meth:`routed`. Undeclared is a deployment that forgot
        ``DISABLE_SERVER_SIDE_CURSORS`` (and ``tenancy.databases(pooled=...)``):
        only the host and port change, and the library must notice the pooler
        by itself.
        """
        if declared:
            with self.routed(alias):
                yield
            return
        with connection_settings(alias, HOST="127.0.0.1", PORT=str(self.port),
                                 CONN_MAX_AGE=None):
            yield


@contextlib.contextmanager
def pool_of_one(pool_size: int = 1, *, reset: bool = True) -> Iterator[Pooler]:
    """Start a pgbouncer (transaction mode) in front of the test cluster.

    One server session per pool unless ``pool_size`` says more (a loop process
    that is to be cut off by :meth:`Pooler.restart` needs a few).

    ``reset``: it resets every session-level setting before it lends a server
    session again, as docs/scaling.md configures pgbouncer; without, a setting
    one borrower SET meets the next (a deployment that left it out).

    Its files live in a directory of its own under /var/tmp (as root it runs
    as the ``postgres`` account, which must reach them); the process is
    stopped by its id at the end, and the directory removed.
    """
    if not os.access(PGBOUNCER, os.X_OK):
        raise RuntimeError(
            f"{PGBOUNCER} is missing: as root, run 'apt-get install -y pgbouncer' (Debian's "
            "package; scripts/services installs it when it starts PostgreSQL as root)"
        )
    root = os.geteuid() == 0
    workdir = Path(tempfile.mkdtemp(prefix="dio-pool-of-one.", dir="/var/tmp"))
    port = _free_port()
    roles = {db["USER"]: db["PASSWORD"] for db in settings.DATABASES.values()}
    (workdir / "userlist.txt").write_text(
        "".join(f'"{user}" "{password}"\n' for user, password in sorted(roles.items()))
    )
    db = settings.DATABASES["owner"]
    (workdir / "pgbouncer.ini").write_text(f"""\
[databases]
* = host={db["HOST"]} port={db["PORT"]} pool_size={pool_size}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {workdir}/userlist.txt
pool_mode = transaction
default_pool_size = {pool_size}
server_reset_query = {"RESET ALL" if reset else ""}
server_reset_query_always = {int(reset)}
max_client_conn = 100
server_login_retry = 1
log_connections = 0
log_disconnections = 0
logfile = {workdir}/pgbouncer.log
""")
    if root:
        shutil.chown(workdir, "postgres")
        for name in ("userlist.txt", "pgbouncer.ini"):
            shutil.chown(workdir / name, "postgres")
    os.chmod(workdir / "userlist.txt", 0o600)
    # As root, as the postgres account (pgbouncer refuses to run as root),
    # still this process's child: it is stopped by its own id.
    account: dict[str, Any] = (
        {"user": "postgres", "group": "postgres", "extra_groups": []} if root else {}
    )

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([PGBOUNCER, str(workdir / "pgbouncer.ini")], cwd="/",
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent, **account)

    pooler = Pooler(port, start)
    try:
        try:
            pooler.start()
        except RuntimeError:
            log = (workdir / "pgbouncer.log")
            raise RuntimeError(
                "the private pgbouncer did not start: "
                + (log.read_text()[-2000:] if log.exists() else "no log")
            ) from None
        yield pooler
    finally:
        pooler.stop()  # SIGTERM: pgbouncer shuts down at once
        shutil.rmtree(workdir, ignore_errors=True)
