"""``manage.py create_roles``: the four roles and the database, from a superuser's connection.

Against the real server of the suite, with role and database names of each
test's own (dropped afterwards). The settings are what ``tenancy.databases()``
writes for them.
"""

from __future__ import annotations

import io
import os
import stat
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings
from psycopg import sql

from django_idempotency_outbox.errors import ConfigurationError
from tenancy import databases
from tenancy.provision import passfile_password, saslprep, scram_verifier
from tests.helpers import superuser

KINDS = ("owner", "app", "worker", "system")

# create_roles reads settings.DATABASES and opens no connection of Django's: overriding is safe.
pytestmark = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


class Project:
    """Settings naming roles and a database that do not exist yet."""

    def __init__(self, tmp: Path, **kwargs) -> None:
        self.name = f"cr{uuid.uuid4().hex[:8]}"
        self.passfile = tmp / "secrets" / ".pgpass"
        owner = settings.DATABASES["owner"]
        url = f"postgres://{owner['HOST']}:{owner['PORT']}/{self.name}"
        self.databases = databases(url, passfile=self.passfile, **kwargs)
        self.roles = {kind: f"{self.name}_{kind}" for kind in KINDS}
        self.superuser_url = (
            f"host={os.environ['DIO_PGSOCKET']} port={owner['PORT']} user=postgres dbname=postgres"
        )

    def run(self, *args: str, **options) -> tuple[str, str]:
        out, err = io.StringIO(), io.StringIO()
        tenancy = {k: v for k, v in settings.TENANCY.items() if k != "ROLES"}
        with override_settings(DATABASES=self.databases,
                               TENANCY={**tenancy, "APP_DATABASE": "default",
                                        "WORKER_DATABASE": "worker",
                                        "SYSTEM_DATABASE": "system"}):
            if "print_only" not in options:
                options.setdefault("superuser_url", self.superuser_url)
            call_command("create_roles", *args, stdout=out, stderr=err, **options)
        return out.getvalue(), err.getvalue()

    def attributes(self) -> dict[str, tuple]:
        with superuser("postgres") as conn:
            rows = conn.execute(
                "SELECT rolname, rolcanlogin, rolsuper, rolbypassrls, rolcreatedb, rolcreaterole,"
                " rolpassword FROM pg_authid WHERE rolname = ANY(%s)",
                [list(self.roles.values())],
            ).fetchall()
        return {row[0]: row[1:] for row in rows}

    def database_owner(self) -> str | None:
        with superuser("postgres") as conn:
            row = conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database"
                               " WHERE datname = %s", [self.name]).fetchone()
        return row[0] if row else None

    def login(self, kind: str, password: str | None = None) -> str:
        owner = settings.DATABASES["owner"]
        with psycopg.connect(host=owner["HOST"], port=owner["PORT"], user=self.roles[kind],
                             dbname=self.name, password=password,
                             passfile=str(self.passfile)) as conn:
            return conn.execute("SELECT current_user").fetchone()[0]

    def drop(self) -> None:
        with superuser("postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            for role in self.roles.values():
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@pytest.fixture
def project(tmp_path):
    made = Project(tmp_path)
    try:
        yield made
    finally:
        made.drop()


def test_it_creates_the_four_roles_as_the_design_requires_and_the_database(project):
    out, _ = project.run()
    facts = project.attributes()
    #          LOGIN  SUPER  BYPASSRLS CREATEDB CREATEROLE
    assert facts[project.roles["owner"]][:5] == (True, False, False, True, False)
    assert facts[project.roles["app"]][:5] == (True, False, False, False, False)
    assert facts[project.roles["worker"]][:5] == (True, False, False, False, False)
    assert facts[project.roles["system"]][:5] == (True, False, True, False, False)
    assert project.database_owner() == project.roles["owner"]
    for kind in KINDS:
        assert f"role {project.roles[kind]}: created" in out
        assert project.login(kind) == project.roles[kind]  # its password is in the passfile
    assert f"database {project.name}: created, owned by {project.roles['owner']}" in out
    assert stat.S_IMODE(project.passfile.stat().st_mode) == 0o600
    with superuser() as conn:  # outbox_status and outbox_health see what holds delivery back
        assert conn.execute("SELECT pg_has_role(%s, 'pg_read_all_stats', 'MEMBER')",
                            [project.roles["system"]]).fetchone()[0]


def test_a_second_run_changes_nothing_and_says_so(project):
    project.run()
    before = project.attributes()
    passfile = project.passfile.read_text()
    out, _ = project.run()
    assert project.attributes() == before  # passwords (their verifiers) too
    assert project.passfile.read_text() == passfile
    assert out.splitlines() == [
        *(f"role {project.roles[kind]}: exists, as required" for kind in KINDS),
        f"database {project.name}: exists, owned by {project.roles['owner']}",
        "nothing to change",
    ]


def test_an_existing_role_whose_password_is_nowhere_is_said_and_left_alone(project):
    """A second checkout, or a lost password file: the roles exist, the file does not."""
    project.run()
    before = project.attributes()
    project.passfile.unlink()
    out, err = project.run()
    assert project.attributes() == before  # no password changed
    assert not project.passfile.exists()  # and none written
    assert out.splitlines()[-1] == "nothing to change"
    for kind in KINDS:
        role = project.roles[kind]
        assert (f"warning: role {role}: no password for it in DATABASES" in err
                and f"ALTER ROLE \"{role}\" PASSWORD '...'" in err), err


def test_no_password_is_ever_shown_or_sent(project):
    out, err = project.run()
    printed, notes = project.run(print_only=True)
    passwords = [passfile_password(project.passfile, role) for role in project.roles.values()]
    assert all(passwords)
    for text in (out, err, printed, notes):
        assert not any(password in text for password in passwords)
    # The server stores what it was sent: a SCRAM verifier, never the password.
    for verifier in (v[-1] for v in project.attributes().values()):
        assert verifier.startswith("SCRAM-SHA-256$4096:")


def test_print_shows_the_sql_a_dba_runs_and_the_roles_it_makes_log_in(project):
    printed, notes = project.run(print_only=True)
    assert project.attributes() == {}  # nothing ran
    lines = printed.strip().splitlines()
    assert [line.split(" PASSWORD ")[0] for line in lines] == [
        f'CREATE ROLE "{project.roles["owner"]}" LOGIN CREATEDB',
        f'CREATE ROLE "{project.roles["app"]}" LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB'
        " NOCREATEROLE NOREPLICATION",
        f'CREATE ROLE "{project.roles["worker"]}" LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB'
        " NOCREATEROLE NOREPLICATION",
        f'CREATE ROLE "{project.roles["system"]}" LOGIN NOSUPERUSER BYPASSRLS NOCREATEDB'
        " NOCREATEROLE NOREPLICATION",
        f'CREATE DATABASE "{project.name}" OWNER "{project.roles["owner"]}";',
        f'GRANT pg_read_all_stats TO "{project.roles["system"]}";',
    ]
    assert all(str(project.passfile) in note for note in notes.strip().splitlines())
    # What a DBA does with it: pipe it into psql as a superuser.
    owner = settings.DATABASES["owner"]
    subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-q", "-h", os.environ["DIO_PGSOCKET"],
                    "-p", str(owner["PORT"]), "-U", "postgres", "-d", "postgres"],
                   input=printed, text=True, check=True, capture_output=True)
    for kind in KINDS:
        assert project.login(kind) == project.roles[kind]
    out, _ = project.run()  # and the command, afterwards, finds everything in place
    assert out.strip().endswith("nothing to change")


def test_a_role_that_differs_from_the_design_is_altered(project):
    project.run()
    roles = project.roles
    with superuser("postgres") as conn:
        conn.execute(f'ALTER ROLE "{roles["app"]}" BYPASSRLS CREATEROLE')
        conn.execute(f'ALTER ROLE "{roles["system"]}" NOBYPASSRLS')
        conn.execute(f'GRANT "{roles["owner"]}" TO "{roles["worker"]}"')
    out, _ = project.run()
    assert f"role {roles['app']}: exists; altered to NOBYPASSRLS NOCREATEROLE" in out
    assert f"role {roles['system']}: exists; altered to BYPASSRLS" in out
    assert f"role {roles['worker']}: was a member of the owner {roles['owner']}; no longer" in out
    facts = project.attributes()
    assert facts[roles["app"]][:5] == (True, False, False, False, False)
    assert facts[roles["system"]][:5] == (True, False, True, False, False)
    with superuser("postgres") as conn:
        member = conn.execute("SELECT pg_has_role(%s, %s, 'MEMBER')",
                              [roles["worker"], roles["owner"]]).fetchone()[0]
    assert member is False
    assert project.run()[0].strip().endswith("nothing to change")


def test_settings_and_attributes_that_differ_are_put_back(project, settings):
    """Issue 29, item 7: what create_roles makes includes the roles' settings (exactly
    TENANCY["ROLE_SETTINGS"]), no connection limit and no expiry; a second run puts back what
    the web role (or anyone) changed since."""
    settings.TENANCY = {**settings.TENANCY,
                        "ROLE_SETTINGS": {"app": {"statement_timeout": "30s"}}}
    out, _ = project.run(print_only=True)
    assert (f'ALTER ROLE "{project.roles["app"]}" IN DATABASE "{project.name}" SET'
            " statement_timeout = '30s';") in out
    project.run()
    roles = project.roles
    with psycopg.connect(host=settings.DATABASES["owner"]["HOST"],
                         port=settings.DATABASES["owner"]["PORT"], user=roles["app"],
                         dbname=project.name, passfile=str(project.passfile),
                         autocommit=True) as web:
        assert web.execute("SHOW statement_timeout").fetchone()[0] == "30s"
        web.execute(f'ALTER ROLE CURRENT_USER IN DATABASE "{project.name}"'
                    " SET statement_timeout = 0")
        web.execute("ALTER ROLE CURRENT_USER SET search_path = pg_catalog")
        web.execute(f'ALTER ROLE CURRENT_USER IN DATABASE "{project.name}"'
                    " SET default_transaction_read_only = on")
    with superuser("postgres") as conn:
        conn.execute(f'ALTER ROLE "{roles["worker"]}" CONNECTION LIMIT 2'
                     " VALID UNTIL '2999-01-01'")
    out, _ = project.run()
    assert (f"role {roles['app']} (app) has statement_timeout = '0', where create_roles sets "
            "'30s': put back") in out, out
    assert (f"role {roles['app']} (app) has search_path = 'pg_catalog', which create_roles"
            " does not set: put back") in out
    assert (f"role {roles['app']} (app) has default_transaction_read_only = 'on', which"
            " create_roles does not set: put back") in out
    assert f"role {roles['worker']} (worker) has CONNECTION LIMIT 2" in out
    with superuser("postgres") as conn:
        rows = conn.execute(
            "SELECT r.rolname, s.setdatabase <> 0, s.setconfig FROM pg_db_role_setting s"
            " JOIN pg_roles r ON r.oid = s.setrole WHERE r.rolname = ANY(%s)",
            [list(roles.values())]).fetchall()
        limit, expiry = conn.execute("SELECT rolconnlimit, rolvaliduntil::text FROM pg_roles"
                                     " WHERE rolname = %s", [roles["worker"]]).fetchone()
    assert rows == [(roles["app"], True, ["statement_timeout=30s"])]
    assert (limit, expiry) == (-1, "infinity")
    assert project.run()[0].strip().endswith("nothing to change")


def test_a_database_owned_by_another_role_is_reported_not_taken(project):
    with superuser("postgres") as conn:
        conn.execute(f'CREATE DATABASE "{project.name}"')
    with pytest.raises(CommandError, match=rf"database {project.name} exists, owned by postgres,"
                       rf" not {project.roles['owner']}: .*ALTER DATABASE \"{project.name}\""):
        project.run()
    assert project.database_owner() == "postgres"


def test_a_password_from_the_settings_is_used_and_no_file_is_written(tmp_path):
    project = Project(tmp_path)
    for alias, entry in project.databases.items():
        entry["PASSWORD"] = f"from-the-environment-{alias}"
        entry["OPTIONS"].pop("passfile")
    try:
        out, _ = project.run()
        assert 'its password in DATABASES["default"]["PASSWORD"]' in out
        assert not project.passfile.exists()
        assert project.login("app", "from-the-environment-default") == project.roles["app"]
    finally:
        project.drop()


def test_it_refuses_a_connection_that_is_not_a_superuser(project):
    owner = settings.DATABASES["owner"]
    url = (f"host={owner['HOST']} port={owner['PORT']} user={owner['USER']}"
           f" password={owner['PASSWORD']} dbname=postgres")
    with pytest.raises(CommandError, match="which is not a superuser"):
        project.run(superuser_url=url)
    assert project.attributes() == {}


def test_a_password_file_line_is_reused_for_a_role_created_again(project):
    project.run()
    first = passfile_password(project.passfile, project.roles["app"])
    project.drop()
    project.run()
    assert passfile_password(project.passfile, project.roles["app"]) == first
    assert project.passfile.read_text().count(f":{project.roles['app']}:") == 1
    assert project.login("app") == project.roles["app"]


#: Passwords that take each path of PostgreSQL's SASLprep (src/common/saslprep.c).
PASSWORDS = {
    "ascii": "plain-ascii-0123",
    "mapped and normalized": "paß wörd Ⅸ",
    "mapped to nothing, a non-ASCII space": "\u00adsoft\u00a0space",
    "a zero-width space (C.1.2 before B.1)": "zero\u200bwidth",
    "only zero-width spaces": "\u200b\u200b",
    "only characters mapped to nothing": "\u00ad\u200c",
    "other spaces of C.1.2": "a\u2000b\u2009c\u3000d",
    "a ligature (NFKC)": "\ufb01nance-\u2163",
    "right to left, whole": "\u05d0\u05d1\u05d2",
    "right to left mixed with left to right": "\u05d0abc\u05d1",
    "right to left not at both ends": "\u05d0\u05d11",
    "a prohibited control": "bell\u0085ring",
    "a private use character": "secret\ue000",
    "unassigned in Unicode 3.2": "new\u0221char",
    "a tag character": "tag\U000e0041",
}


@pytest.mark.parametrize("password", list(PASSWORDS.values()), ids=list(PASSWORDS))
def test_the_scram_verifier_logs_in_as_libpq_computes_it(password, tmp_path):
    """SASLprep as PostgreSQL applies it, or a non-ASCII password would not log in. Issue 29,
    item 8: a password with U+200B did not (mapped to nothing here, to a space there)."""
    role = f"cr{uuid.uuid4().hex[:8]}"
    owner = settings.DATABASES["owner"]
    with superuser("postgres") as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{scram_verifier(password)}'")
    try:
        with psycopg.connect(host=owner["HOST"], port=owner["PORT"], user=role,
                             password=password, dbname="postgres") as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] == role
    finally:
        with superuser("postgres") as conn:
            conn.execute(f"DROP ROLE {role}")
    assert saslprep("\u00adsoft\u00a0space") == b"soft space"
    assert saslprep("zero\u200bwidth") == b"zero width"


def test_create_roles_writes_a_password_with_a_zero_width_space_that_logs_in(tmp_path):
    project = Project(tmp_path)
    for alias, entry in project.databases.items():
        entry["PASSWORD"] = f"zero\u200bwidth {alias}"
        entry["OPTIONS"].pop("passfile")
    try:
        project.run()
        assert project.login("app", "zero\u200bwidth default") == project.roles["app"]
    finally:
        project.drop()


def test_every_identifier_is_quoted_a_keyword_as_a_role_name_included(tmp_path):
    """Issue 29, item 8: --print wrote a role called user unquoted (invalid SQL); the
    command and its --print quote every name, and both create what the settings name."""
    name = f"cr{uuid.uuid4().hex[:8]}"
    roles = {"owner": f"{name}_owner", "app": "user", "worker": f"{name} Worker",
             "system": f'{name}"system'}
    project = Project(tmp_path, roles=roles)
    project.roles = roles
    try:
        printed, _ = project.run(print_only=True)
        for role in roles.values():
            quoted = '"' + role.replace('"', '""') + '"'
            assert f"CREATE ROLE {quoted} " in printed
        assert f'CREATE DATABASE "{project.name}" OWNER "{roles["owner"]}";' in printed
        owner = settings.DATABASES["owner"]
        subprocess.run(["psql", "-v", "ON_ERROR_STOP=1", "-q", "-h", os.environ["DIO_PGSOCKET"],
                        "-p", str(owner["PORT"]), "-U", "postgres", "-d", "postgres"],
                       input=printed, text=True, check=True, capture_output=True)
        assert set(project.attributes()) == set(roles.values())
        assert project.run()[0].strip().endswith("nothing to change")
        project.drop()
        project.run()  # and the command itself
        for kind in KINDS:
            assert project.login(kind) == roles[kind]
    finally:
        project.drop()


@pytest.mark.parametrize("kind", ["app", "owner", "database"])
def test_a_name_postgresql_would_cut_is_refused_before_anything_runs(kind, tmp_path):
    """Issue 29, item 8: PostgreSQL keeps 63 bytes of a name; a longer one was cut, and the
    second run looked for (and failed on) the whole name."""
    from tenancy.provision import target

    project = Project(tmp_path)
    long = "r" * 60 + "é" * 2  # 64 bytes, 62 characters
    if kind == "database":
        project.databases["owner"]["NAME"] = long
    else:
        project.databases[{"app": "default", "owner": "owner"}[kind]]["USER"] = long
    with override_settings(DATABASES=project.databases, TENANCY={
            **{k: v for k, v in settings.TENANCY.items() if k != "ROLES"},
            "APP_DATABASE": "default", "WORKER_DATABASE": "worker", "SYSTEM_DATABASE": "system"}):
        with pytest.raises(ConfigurationError, match="64 bytes long: PostgreSQL keeps 63"):
            target("owner")
        for print_only in (True, False):
            with pytest.raises(CommandError, match="64 bytes long"):
                call_command("create_roles", print_only=print_only, stdout=io.StringIO(),
                             superuser_url=project.superuser_url)
    assert project.attributes() == {}
