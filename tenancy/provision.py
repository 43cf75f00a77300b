"""The four roles and the database of a deployment, created from a superuser's connection.

``manage.py create_roles`` is a thin layer over :func:`provision` and :func:`script`;
docs/commands.md says what it does, and where each password comes from. No password is
ever shown or sent: the server gets a SCRAM-SHA-256 verifier computed here.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import stringprep
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from django_idempotency_outbox.errors import ConfigurationError
from django_idempotency_outbox.sqlfiles import queries
from tenancy.layout import MAX_NAME_BYTES
from tenancy.privileges import quote, role_names

#: Role attributes each kind must have (pg_roles column -> wanted). The owner
#: needs CREATEDB for the test database of ``manage.py test`` only.
_UNPRIVILEGED = {"rolcanlogin": True, "rolsuper": False, "rolbypassrls": False,
                 "rolcreatedb": False, "rolcreaterole": False, "rolreplication": False}
REQUIRED: dict[str, dict[str, bool]] = {
    "owner": {"rolcanlogin": True, "rolcreatedb": True},
    "app": _UNPRIVILEGED,
    "worker": _UNPRIVILEGED,
    "system": {**_UNPRIVILEGED, "rolbypassrls": True},
}
_KEYWORDS = {
    "rolcanlogin": ("LOGIN", "NOLOGIN"),
    "rolsuper": ("SUPERUSER", "NOSUPERUSER"),
    "rolbypassrls": ("BYPASSRLS", "NOBYPASSRLS"),
    "rolcreatedb": ("CREATEDB", "NOCREATEDB"),
    "rolcreaterole": ("CREATEROLE", "NOCREATEROLE"),
    "rolreplication": ("REPLICATION", "NOREPLICATION"),
}
KINDS = ("owner", "app", "worker", "system")

#: The role-level parameters a guarantee of the library rests on: what a value
#: other than ``TENANCY["ROLE_SETTINGS"]``'s breaks, and whether it is the
#: outbox's delivery (then health reports it too). The web role may set any of
#: them on itself, for every later session (``ALTER ROLE CURRENT_USER SET``).
GUARANTEED: dict[str, tuple[str, bool]] = {
    "app.tenant_id": ("every session starts as that tenant: in the plain mode, a query "
                      "outside tenant_context() reads and writes its rows", False),
    "app.tenant_token": ("every session starts with that token", False),
    "search_path": ("names resolve where it says, for your queries outside tenant_context() "
                    "and for the schemas the library pins (read from a session's start)",
                    False),
    "row_security": ("off: every query on a tenant-isolated table fails", False),
    "role": ("every session starts as another role", False),
    "lock_timeout": ("statements give up waiting for locks after it (or never)", False),
    "default_transaction_read_only": ("nothing is written: no publish, no stored answer, no "
                                      "offset moves", True),
    "default_transaction_isolation": ("the outbox's readers refuse anything but READ "
                                      "COMMITTED, and delivery stops", True),
    "synchronous_commit": ("a commit is acknowledged before it is on disk: a message the relay "
                           "sent may vanish with its change in a crash", True),
    "statement_timeout": ("a publishing transaction's statement may hold its tenants back "
                          "that long (0: for ever)", True),
    "idle_in_transaction_session_timeout": ("an idle publishing transaction may hold its "
                                            "tenants back that long (0: for ever)", True),
}


@dataclass(frozen=True)
class Target:
    """What the settings name: the roles (by kind), their aliases, the database."""

    roles: dict[str, str]
    aliases: dict[str, str]
    database: str
    host: str
    port: str


@dataclass
class Step:
    """One thing to do (``sql`` empty: nothing to do), and the line that says it."""

    message: str
    sql: str = ""


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    error: str = ""
    #: things the caller should hear about that change nothing (stderr)
    warnings: list[str] = field(default_factory=list)

    @property
    def changes(self) -> list[Step]:
        return [step for step in self.steps if step.sql]


def target(owner_alias: str) -> Target:
    """The roles and database the settings name; ``owner_alias`` logs in as the owner."""
    from tenancy.conf import tenancy_settings

    if owner_alias not in settings.DATABASES:
        raise ConfigurationError(
            f"database alias {owner_alias!r} is not in DATABASES: name the owner's alias "
            "with --database"
        )
    owner = settings.DATABASES[owner_alias]
    names = role_names()
    aliases = {
        "app": tenancy_settings.APP_DATABASE,
        "worker": tenancy_settings.WORKER_DATABASE,
        "system": tenancy_settings.SYSTEM_DATABASE,
        "owner": owner_alias,
    }
    roles = {"owner": str(owner.get("USER") or "")}
    roles.update({kind: names.get(kind, "") for kind in ("app", "worker", "system")})
    missing = [kind for kind in KINDS if not roles[kind]]
    if missing:
        raise ConfigurationError(
            f"no role named for {', '.join(missing)}: give each alias a USER (tenancy.databases() "
            "does) or name it in TENANCY[\"ROLES\"]"
        )
    if len(set(roles.values())) != len(roles):
        raise ConfigurationError(f"each kind needs a role of its own, not {roles}")
    if not owner.get("NAME"):
        raise ConfigurationError(f"DATABASES[{owner_alias!r}] names no database (NAME)")
    for what, name in [*((f"the {kind} role", role) for kind, role in roles.items()),
                       ("the database", str(owner["NAME"]))]:
        refuse_truncated(what, name)
    return Target(roles, aliases, str(owner["NAME"]), str(owner.get("HOST") or ""),
                  str(owner.get("PORT") or ""))


def refuse_truncated(what: str, name: str) -> None:
    """Refuse a name PostgreSQL would cut: a role made under it would not be found again."""
    size = len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        raise ConfigurationError(
            f"{what} {name!r} is {size} bytes long: PostgreSQL keeps {MAX_NAME_BYTES} bytes of a "
            "name and would cut the rest, so the next run would look for another name. Choose "
            f"a name of at most {MAX_NAME_BYTES} bytes."
        )


@dataclass(frozen=True)
class Shape:
    """A role as the catalogs show it: attributes, and its role-level settings."""

    attributes: dict[str, bool]
    connection_limit: int
    expires: bool  #: VALID UNTIL a time (create_roles sets none)
    settings: dict[str, str]  #: for every database
    database_settings: dict[str, str]  #: for the database (they win there)
    database: str


def shapes(rows: Iterable[tuple[Any, ...]]) -> dict[str, Shape]:
    """The rows of ``tenancy/queries.sql``'s ``role_shapes``, by role name."""
    def split(configs: Iterable[str]) -> dict[str, str]:
        return dict(config.split("=", 1) for config in configs)

    found: dict[str, Shape] = {}
    for (name, superuser, bypassrls, createrole, createdb, login, replication, limit, expires,
         everywhere, here, database) in rows:
        attributes = {"rolsuper": superuser, "rolbypassrls": bypassrls,
                      "rolcreaterole": createrole, "rolcreatedb": createdb,
                      "rolcanlogin": login, "rolreplication": replication}
        found[name] = Shape(attributes, limit, expires, split(everywhere), split(here), database)
    return found


@dataclass(frozen=True)
class Drift:
    """One way a role differs from what create_roles made of it."""

    kind: str
    role: str
    name: str  #: a parameter, or an attribute's keyword
    found: str | None  #: a setting's value in the database (None: not set)
    wanted: str | None
    database: str = ""  #: the database whose sessions it concerns
    #: a setting: where it is set (ALTER ROLE ... SET, ALTER ROLE ... IN DATABASE ... SET)
    everywhere: bool = False
    here: bool = False
    attribute: bool = False  #: an attribute (``name`` is the one to have), not a setting

    @property
    def breaks(self) -> str:
        """What the difference breaks ("" when nothing the library promises)."""
        if self.attribute:
            return ATTRIBUTE_BREAKS.get(self.found or "", "")
        return GUARANTEED.get(self.name, ("", False))[0]

    @property
    def delivery(self) -> bool:
        """Whether it breaks a promise of the outbox's delivery (health reports it)."""
        return not self.attribute and GUARANTEED.get(self.name, ("", False))[1]

    @property
    def said(self) -> str:
        """The difference, in a phrase: ``role shop_app (app) has ..., where create_roles ...``."""
        who = f"role {self.role} ({self.kind})"
        if self.attribute:
            return f"{who} has {self.found}, where create_roles makes {self.wanted}"
        if self.found is None:
            return f"{who} lacks {self.name} = {self.wanted!r}, which create_roles sets"
        if self.wanted is None:
            return f"{who} has {self.name} = {self.found!r}, which create_roles does not set"
        return f"{who} has {self.name} = {self.found!r}, where create_roles sets {self.wanted!r}"

    @property
    def statements(self) -> list[str]:
        """What puts it back, as a superuser (what create_roles runs)."""
        role = quote(self.role)
        if self.attribute:
            return [f"ALTER ROLE {role} {self.wanted};"]
        database = quote(self.database)
        if self.wanted is not None:  # a database's own setting wins over the role's
            return [f"ALTER ROLE {role} IN DATABASE {database} SET {self.name} = "
                    f"{literal(self.wanted)};"]
        return ([f"ALTER ROLE {role} IN DATABASE {database} RESET {self.name};"] * self.here
                + [f"ALTER ROLE {role} RESET {self.name};"] * self.everywhere)

    @property
    def fix(self) -> str:
        return " ".join(self.statements)


ATTRIBUTE_BREAKS = {
    "SUPERUSER": "row-level security does not apply to a superuser",
    "BYPASSRLS": "row-level security does not apply to it",
    "NOBYPASSRLS": "cross-tenant upkeep sees one tenant at most",
    "CREATEROLE": "it may create roles and grant itself their membership",
    "REPLICATION": "it may stream the write-ahead log: every tenant's rows",
}


def literal(value: str) -> str:
    """An SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def drift(kind: str, role: str, shape: Shape) -> list[Drift]:
    """How ``role`` (of ``kind``: app, worker or system) differs from what create_roles makes:
    the required attributes, no connection limit or expiry, and exactly
    ``TENANCY["ROLE_SETTINGS"][kind]`` in the database (where a database's settings win)."""
    from tenancy.conf import tenancy_settings

    found: list[Drift] = []
    for column, wanted in REQUIRED[kind].items():
        if shape.attributes.get(column) != wanted:
            yes, no = _KEYWORDS[column]
            found.append(Drift(kind, role, yes if wanted else no,
                               no if wanted else yes, yes if wanted else no, attribute=True))
    if shape.connection_limit != -1:
        found.append(Drift(kind, role, "CONNECTION LIMIT -1",
                           f"CONNECTION LIMIT {shape.connection_limit}", "CONNECTION LIMIT -1",
                           attribute=True))
    if shape.expires:
        found.append(Drift(kind, role, "VALID UNTIL 'infinity'", "VALID UNTIL a time",
                           "VALID UNTIL 'infinity'", attribute=True))
    wanted_settings = tenancy_settings.ROLE_SETTINGS.get(kind, {})
    effective = {**shape.settings, **shape.database_settings}
    for name in sorted(set(wanted_settings) | set(effective)):
        if effective.get(name) != wanted_settings.get(name):
            found.append(Drift(kind, role, name, effective.get(name), wanted_settings.get(name),
                               shape.database, everywhere=name in shape.settings,
                               here=name in shape.database_settings))
    return found


def role_drift(using: str) -> list[Drift]:
    """:func:`drift` of each role the settings name that exists, seen through ``using`` (any
    alias: the catalogs are readable by every role)."""
    from tenancy.context import SQL
    from tenancy.statements import fetch_all

    names = role_names()
    found = shapes(fetch_all(using, SQL["role_shapes"],
                             {"roles": sorted(set(names.values())), "database": None}))
    return [d for kind, role in names.items() if role in found
            for d in drift(kind, role, found[role])]


def _unescape(field_text: str) -> str:
    return re.sub(r"\\(.)", r"\1", field_text)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(":", "\\:")


def passfile_password(path: Path, role: str) -> str | None:
    """The password the libpq password file holds for ``role`` (the first line naming it)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = re.split(r"(?<!\\):", line, maxsplit=4)
        if len(fields) == 5 and _unescape(fields[3]) == role:
            return _unescape(fields[4])
    return None


def write_passfile(path: Path, role: str, password: str) -> None:
    """Append ``*:*:*:role:password`` to the password file, created (or kept) mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(descriptor, "a") as sink:
        if path.stat().st_size and not path.read_text().endswith("\n"):
            sink.write("\n")
        sink.write(f"*:*:*:{_escape(role)}:{_escape(password)}\n")
    os.chmod(path, 0o600)  # libpq ignores a file others can read


def alias_passfile(alias: str) -> Path | None:
    options = settings.DATABASES.get(alias, {}).get("OPTIONS") or {}
    passfile = options.get("passfile")
    return Path(passfile) if passfile else None


@dataclass(frozen=True)
class Password:
    value: str
    source: str  # where it is kept, for the message: never the password


def password_for(kind: str, role: str, alias: str) -> Password:
    """The password a new role gets: the alias's PASSWORD, its passfile's, or a new one there."""
    configured = settings.DATABASES.get(alias, {}).get("PASSWORD")
    if configured:
        return Password(str(configured), f'DATABASES["{alias}"]["PASSWORD"]')
    path = alias_passfile(alias)
    if path is None:
        raise ConfigurationError(
            f"no password for the {kind} role {role!r}: set DATABASES[{alias!r}][\"PASSWORD\"] "
            "or a password file (tenancy.databases(..., passfile=...)) to write one to"
        )
    found = passfile_password(path, role)
    if found is not None:
        return Password(found, str(path))
    generated = secrets.token_urlsafe(24)
    write_passfile(path, role, generated)
    return Password(generated, f"{path} (new)")


def saslprep(password: str) -> bytes:
    """SASLprep (RFC 4013) exactly as PostgreSQL's ``pg_saslprep()`` (src/common/saslprep.c)
    applies it, so that a verifier computed here is the one the server computes at login.

    Its order matters: a non-ASCII space (table C.1.2, U+200B among them) becomes a space
    *before* anything is mapped to nothing (table B.1 lists U+200B too), or a password with
    U+200B would never log in; prohibited characters and the bidirectional rule are checked
    on the mapped string before NFKC; a failing check means the raw bytes, as in PostgreSQL.
    """
    raw = password.encode("utf-8")
    if password.isascii():
        return raw
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else "" if stringprep.in_table_b1(c) else c
        for c in password
    )
    if not mapped:
        return raw
    prohibited: tuple[Callable[[str], bool], ...] = (
        stringprep.in_table_c12, stringprep.in_table_c21_c22, stringprep.in_table_c3,
        stringprep.in_table_c4, stringprep.in_table_c5, stringprep.in_table_c6,
        stringprep.in_table_c7, stringprep.in_table_c8, stringprep.in_table_c9,
        stringprep.in_table_a1,
    )
    if any(check(c) for c in mapped for check in prohibited):
        return raw
    if any(stringprep.in_table_d1(c) for c in mapped):
        if any(stringprep.in_table_d2(c) for c in mapped):
            return raw
        if not (stringprep.in_table_d1(mapped[0]) and stringprep.in_table_d1(mapped[-1])):
            return raw
    return unicodedata.normalize("NFKC", mapped).encode("utf-8")


def scram_verifier(password: str, *, salt: bytes | None = None, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 secret PostgreSQL stores for ``password`` (RFC 5802, RFC 7677)."""
    salt = salt if salt is not None else os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", saslprep(password), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def _attributes(kind: str, current: dict[str, bool] | None = None) -> list[str]:
    """The keywords of ``kind``'s required attributes (only those that differ from ``current``)."""
    return [
        _KEYWORDS[column][0 if wanted else 1]
        for column, wanted in REQUIRED[kind].items()
        if current is None or current.get(column) != wanted
    ]


def plan(
    goal: Target,
    roles: dict[str, dict[str, Any]],
    members_of_owner: Iterable[str],
    database_owner: str | None,
    database_exists: bool,
    passwords: Callable[[str], Password],
    known: Callable[[str], str | None] = lambda kind: "",
    shaped: dict[str, Shape] | None = None,
    stats_readers: Iterable[str] = (),
) -> Plan:
    """What to do to reach ``goal`` from the catalog state given (empty: a new server).

    ``known(kind)`` says where an existing role's password is kept (None: nowhere, and the plan
    warns; an existing role's password is never changed here). ``shaped`` (by role) gives the
    existing roles' shapes: their :func:`drift` is put back.
    """
    from tenancy.conf import tenancy_settings

    result = Plan()
    members = set(members_of_owner)
    settings_of_new: list[Step] = []  # settings (in the database): once it exists
    for kind in KINDS:
        role = goal.roles[kind]
        current = roles.get(role)
        if current is None:
            password = passwords(kind)
            keywords = " ".join(_attributes(kind))
            result.steps.append(Step(
                f"role {role}: created ({keywords}), its password in {password.source}",
                f"CREATE ROLE {quote(role)} {keywords} "
                f"PASSWORD '{scram_verifier(password.value)}';",
            ))
            settings_of_new.extend(
                Step(f"role {role}: {name} = {value!r} in database {goal.database}",
                     f"ALTER ROLE {quote(role)} IN DATABASE {quote(goal.database)} SET {name} = "
                     f"{literal(value)};")
                for name, value in tenancy_settings.ROLE_SETTINGS.get(kind, {}).items())
            continue
        differ = _attributes(kind, current)
        shape = (shaped or {}).get(role)
        rest = [] if shape is None or kind == "owner" else [
            d for d in drift(kind, role, shape) if not (d.attribute and d.name in differ)]
        if differ:
            result.steps.append(Step(
                f"role {role}: exists; altered to {' '.join(differ)}",
                f"ALTER ROLE {quote(role)} {' '.join(differ)};",
            ))
        elif not rest:
            result.steps.append(Step(f"role {role}: exists, as required"))
        settings_of_new.extend(Step(f"{d.said}: put back" if n == 0 else "", statement)
                               for d in rest for n, statement in enumerate(d.statements))
        if known(kind) is None:
            alias = goal.aliases[kind]
            path = alias_passfile(alias)
            result.warnings.append(
                f"role {role}: no password for it in DATABASES[{alias!r}] or "
                f"{path or 'a password file'}: where the server asks for one, the alias "
                f"{alias!r} cannot log in. An existing role's password is never changed here: "
                f"as a superuser, ALTER ROLE {quote(role)} PASSWORD '...'; then put the "
                f"password in {path or 'the alias settings'} (*:*:*:{role}:<password> in a "
                "password file)."
            )
        if kind != "owner" and role in members:
            result.steps.append(Step(
                f"role {role}: was a member of the owner {goal.roles['owner']}; no longer",
                f"REVOKE {quote(goal.roles['owner'])} FROM {quote(role)};",
            ))
    owner = goal.roles["owner"]
    if not database_exists:
        result.steps.append(Step(
            f"database {goal.database}: created, owned by {owner}",
            f"CREATE DATABASE {quote(goal.database)} OWNER {quote(owner)};",
        ))
    elif database_owner != owner:
        result.error = (
            f"database {goal.database} exists, owned by {database_owner}, not {owner}: if it is "
            f"this project's, run as a superuser ALTER DATABASE {quote(goal.database)} OWNER TO "
            f"{quote(owner)};"
        )
    else:
        result.steps.append(Step(f"database {goal.database}: exists, owned by {owner}"))
    result.steps.extend(settings_of_new)
    system = goal.roles["system"]
    if system not in set(stats_readers):
        result.steps.append(Step(
            f"role {system}: member of pg_read_all_stats (outbox_status and outbox_health show "
            "what holds delivery back)", f"GRANT pg_read_all_stats TO {quote(system)};"))
    return result


def _password_source(goal: Target) -> Callable[[str], Password]:
    return lambda kind: password_for(kind, goal.roles[kind], goal.aliases[kind])


def _known_password(goal: Target) -> Callable[[str], str | None]:
    """Where ``kind``'s existing role's password is kept; None: nowhere (nothing is written)."""
    def where(kind: str) -> str | None:
        alias = goal.aliases[kind]
        if settings.DATABASES.get(alias, {}).get("PASSWORD"):
            return f'DATABASES["{alias}"]["PASSWORD"]'
        path = alias_passfile(alias)
        if path is not None and passfile_password(path, goal.roles[kind]) is not None:
            return str(path)
        return None
    return where


def script(goal: Target) -> tuple[list[str], list[str]]:
    """``--print``: the statements for a server that has none of it yet, and the notes.

    Passwords are settled (and new ones written) as for :func:`provision`; the
    statements carry their SCRAM verifiers only.
    """
    steps = plan(goal, {}, (), None, False, _password_source(goal)).steps
    notes = [step.message for step in steps if "its password in" in step.message]
    return [step.sql for step in steps], notes


def superuser_connection(goal: Target, url: str | None) -> Any:
    """A connection (autocommit) as a superuser: ``url``, or libpq's defaults as ``postgres``."""
    import psycopg

    if url:
        conn = psycopg.connect(url, autocommit=True)
    else:
        conn = psycopg.connect(host=goal.host or None, port=goal.port or None,
                               user="postgres", dbname="postgres", autocommit=True)
    row = conn.execute(queries("tenancy")["superuser_role"]).fetchone()
    if not row or not row[1]:
        conn.close()
        raise ConfigurationError(
            f"the connection logs in as {row[0] if row else '?'!r}, which is not a superuser: "
            "creating roles with BYPASSRLS takes one (or run --print's SQL as one)"
        )
    return conn


def provision(goal: Target, conn: Any) -> Plan:
    """Look at the server, then create or alter what differs from ``goal``; return the plan run."""
    shaped = shapes(conn.execute(
        queries("tenancy")["role_shapes"],
        {"roles": list(goal.roles.values()), "database": goal.database},
    ).fetchall())
    roles = {role: shape.attributes for role, shape in shaped.items()}
    members = [row[0] for row in conn.execute(
        queries("tenancy")["members_of"], {"role": goal.roles["owner"]}).fetchall()]
    readers = [row[0] for row in conn.execute(
        queries("tenancy")["members_of"], {"role": "pg_read_all_stats"}).fetchall()]
    database = conn.execute(
        queries("tenancy")["database_owner"], {"database": goal.database}).fetchone()
    result = plan(goal, roles, members, database[0] if database else None,
                  database is not None, _password_source(goal), _known_password(goal), shaped,
                  readers)
    if result.error:
        return result
    for step in result.changes:
        conn.execute(step.sql)
    return result
