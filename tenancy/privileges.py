"""Who may do what to the library's tables: one matrix, for the grants, the check and the docs.

Each app declares its tables' privileges as ``TABLE_PRIVILEGES`` in its models module, and
:func:`matrix` collects them, as Django's admin discovers ``admin`` modules: tenancy names no
table of the apps above it. docs/roles.md ("Grants follow the migrations") says who applies it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import transaction

from django_idempotency_outbox.sqlfiles import queries
from tenancy.conf import tenancy_settings
from tenancy.statements import affected, fetch_all, fetch_one

#: tenancy's statements, by name (tenancy/queries.sql).
SQL = queries("tenancy")

APP, WORKER, SYSTEM = "app", "worker", "system"
KINDS = (APP, WORKER, SYSTEM)

#: The privileges a table can carry; what the matrix leaves out is revoked.
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
DML = ("SELECT", "INSERT", "UPDATE", "DELETE")

#: One app's declaration: table -> role kind -> privileges (what it leaves out is revoked;
#: docs/roles.md says what each kind does).
TablePrivileges = dict[str, dict[str, tuple[str, ...]]]

#: The name of the declaration in an app's models module.
DECLARATION = "TABLE_PRIVILEGES"

#: tenancy's own rows: Django's record of applied migrations, read through every alias (the
#: consistency checks, the test runner), written by the owner only.
OWN: TablePrivileges = {
    "django_migrations": {APP: ("SELECT",), WORKER: ("SELECT",), SYSTEM: ("SELECT",)},
}


def matrix() -> dict[str, TablePrivileges]:
    """app label -> its tables' privileges: tenancy's own, and each installed app's declaration."""
    rows: dict[str, TablePrivileges] = {"tenancy": OWN}
    for config in apps.get_app_configs():
        declared = getattr(config.models_module, DECLARATION, None)
        if declared and config.label != "tenancy":
            rows[config.label] = declared
    return rows


def governed_apps() -> frozenset[str]:
    """The apps whose tables the matrix governs (their policies ship in their own migrations);
    every other app is yours (``GRANT_PROJECT_TABLES``, policies written by makemigrations)."""
    return frozenset(matrix())


#: The aliases setting of each kind.
_ALIAS_SETTING = {APP: "APP_DATABASE", WORKER: "WORKER_DATABASE", SYSTEM: "SYSTEM_DATABASE"}


@dataclass(frozen=True)
class Grant:
    """One table's privileges for one role (several kinds may share a role)."""

    table: str
    role: str
    kinds: tuple[str, ...]
    privileges: tuple[str, ...]
    revoke_first: bool  # library tables: exactly the matrix; project tables: only add


def role_names() -> dict[str, str]:
    """The role of each kind that has one: ``TENANCY["ROLES"]``, else its alias's ``USER``."""
    names: dict[str, str] = {}
    overrides = tenancy_settings.ROLES
    for kind in KINDS:
        alias = getattr(tenancy_settings, _ALIAS_SETTING[kind])
        user = overrides.get(kind) or settings.DATABASES.get(alias, {}).get("USER") or ""
        if user:
            names[kind] = user
    return names


def library_tables(
    app_labels: Iterable[str] | None = None,
) -> dict[str, dict[str, tuple[str, ...]]]:
    """The matrix rows of the governed apps (of ``app_labels`` only, if given)."""
    wanted = None if app_labels is None else set(app_labels)
    rows: dict[str, dict[str, tuple[str, ...]]] = {}
    for label, tables in matrix().items():
        if wanted is None or label in wanted:
            rows.update(tables)
    return rows


def _project_models() -> list[Any]:
    """Your apps' managed, concrete models (Django's included), whose tables no matrix row
    governs (django-tasks-db's queue is the outbox's)."""
    governed = governed_apps()
    tables = set(library_tables())
    return [
        model for model in apps.get_models(include_auto_created=True)
        if model._meta.app_label not in governed and model._meta.managed
        and not model._meta.proxy and model._meta.db_table not in tables
    ]


def is_shared(model: Any) -> bool:
    """Whether ``TENANCY["SHARED_TABLES"]`` names ``model``'s app or table."""
    shared = set(tenancy_settings.SHARED_TABLES)
    return model._meta.app_label in shared or model._meta.db_table in shared


def closed_tables() -> list[str]:
    """The tables of your apps that ``GRANT_PROJECT_TABLES`` leaves closed to the app role:
    neither tenant-isolated (row-level security) nor listed in ``SHARED_TABLES``."""
    return sorted({
        model._meta.db_table for model in _project_models()
        if not getattr(model, "tenant_isolated", False) and not is_shared(model)
    })


def project_tables(
    app_labels: Iterable[str] | None = None,
) -> dict[str, dict[str, tuple[str, ...]]]:
    """Your apps' tables, when ``TENANCY["GRANT_PROJECT_TABLES"]`` is on (docs/roles.md, "Your
    own tables"): DML to the app and worker roles on the tenant-isolated ones, to the app role
    on the shared ones; nothing on the others (:func:`closed_tables`), nothing revoked."""
    if not tenancy_settings.GRANT_PROJECT_TABLES:
        return {}
    wanted = None if app_labels is None else set(app_labels)
    rows: dict[str, dict[str, tuple[str, ...]]] = {}
    for model in _project_models():
        meta = model._meta
        if wanted is not None and meta.app_label not in wanted:
            continue
        kinds: dict[str, tuple[str, ...]] = {}
        if getattr(model, "tenant_isolated", False):
            kinds = {APP: DML, WORKER: DML}
        elif is_shared(model):
            kinds = {APP: DML}
        if kinds:
            rows[meta.db_table] = kinds
    return rows


def worker_tables() -> frozenset[str]:
    """The tables the matrix opens to the worker role and not to the app role (django-tasks-db's
    queue), whose ORM queries the router sends to the worker alias: worked out once per set of
    installed apps, as the router asks for every query."""
    return _worker_tables(tuple(config.label for config in apps.get_app_configs()))


@functools.lru_cache(maxsize=4)
def _worker_tables(installed: tuple[str, ...]) -> frozenset[str]:
    return frozenset(table for table, kinds in library_tables().items()
                     if WORKER in kinds and APP not in kinds)


def grants(
    app_labels: Iterable[str] | None = None, roles: dict[str, str] | None = None
) -> list[Grant]:
    """What the matrix (and the project tables' opt-in) grants, per table and role."""
    names = role_names() if roles is None else roles
    result: list[Grant] = []
    for rows, exact in ((library_tables(app_labels), True), (project_tables(app_labels), False)):
        for table, by_kind in rows.items():
            by_role: dict[str, list[str]] = {}
            for kind in KINDS:
                if kind in names:
                    by_role.setdefault(names[kind], [])
                    if kind in by_kind:
                        by_role[names[kind]].append(kind)
            for role, kinds in by_role.items():
                privileges = tuple(
                    p for p in TABLE_PRIVILEGES if any(p in by_kind[k] for k in kinds)
                )
                if exact or privileges:
                    result.append(Grant(table, role, tuple(kinds), privileges, exact))
    return result


def quote(name: str) -> str:
    """An SQL identifier, always quoted: a name that is also a keyword (a role called
    ``user``) is then a name too, and a statement printed for a DBA is valid as printed."""
    return '"' + name.replace('"', '""') + '"'


def statements(
    app_labels: Iterable[str] | None = None,
    roles: dict[str, str] | None = None,
    schema: str = "public",
) -> list[str]:
    """The SQL that applies the matrix: what ``grant_privileges --print`` prints."""
    names = role_names() if roles is None else roles
    found = grants(app_labels, names)
    if not found:
        return []
    everyone = ", ".join(quote(r) for r in dict.fromkeys(names.values()))
    lines = [f"GRANT USAGE ON SCHEMA {quote(schema)} TO {everyone};"]
    public_done: set[str] = set()
    for grant in found:
        if grant.revoke_first and grant.table not in public_done:
            public_done.add(grant.table)
            lines.append(f"REVOKE ALL ON {quote(grant.table)} FROM PUBLIC;")
        lines.extend(_grant_lines(grant, grant.privileges))
    return lines


def _grant_lines(grant: Grant, privileges: Iterable[str]) -> list[str]:
    table, role = quote(grant.table), quote(grant.role)
    lines = [f"REVOKE ALL ON {table} FROM {role};"] if grant.revoke_first else []
    wanted = [p for p in TABLE_PRIVILEGES if p in set(privileges)]
    if wanted:
        lines.append(f"GRANT {', '.join(wanted)} ON {table} TO {role};")
    return lines


def _existing(using: str, tables: Sequence[str]) -> set[str]:
    return {row[0] for row in fetch_all(using, SQL["existing_tables"], {"tables": list(tables)})}


def _present(using: str, names: dict[str, str]) -> dict[str, str]:
    """``names`` without the roles that do not exist (the check reports those)."""
    found = fetch_all(using, SQL["existing_roles"], {"roles": sorted(set(names.values()))})
    present = {row[0] for row in found}
    return {kind: role for kind, role in names.items() if role in present}


def _held(using: str, tables: Iterable[str], roles: Iterable[str]) -> set[tuple[str, str, str]]:
    """(table, role, privilege) for each effective privilege (own, inherited or PUBLIC's)."""
    found = fetch_all(using, SQL["held_privileges"], {
        "tables": sorted(set(tables)), "privileges": list(TABLE_PRIVILEGES),
        "roles": sorted(set(roles)),
    })
    return {(t, r, p) for t, r, p, has in found if has}


def owns_tables(using: str, app_labels: Iterable[str] | None = None) -> bool:
    """Whether ``using``'s role owns (or is a member of the owner of) the tables to grant."""
    tables = [g.table for g in grants(app_labels)]
    if not tables:
        return False
    count, owned = fetch_one(using, SQL["owns_tables"], {"tables": tables})
    return bool(count) and bool(owned)


def apply(using: str, app_labels: Iterable[str] | None = None) -> list[str]:
    """Bring the privileges on ``using`` (the owner's alias) to the matrix, in one transaction.

    Only what differs is changed, so running it again runs nothing; your tables only gain what
    is missing. Tables and roles that do not exist are skipped. Returns the statements run.
    """
    labels = None if app_labels is None else list(app_labels)
    with transaction.atomic(using=using):
        schema = fetch_one(using, SQL["current_schema"])[0]
        names = _present(using, role_names())
        found = grants(labels, names)
        existing = _existing(using, [g.table for g in found])
        found = [g for g in found if g.table in existing]
        if not found:
            return []
        todo = []
        lacking = sorted(row[0] for row in fetch_all(
            using, SQL["roles_without_schema_usage"], {"roles": sorted(set(names.values()))}))
        if lacking:
            todo.append(f"GRANT USAGE ON SCHEMA {quote(schema)} "
                        f"TO {', '.join(quote(r) for r in lacking)};")
        exact = sorted({g.table for g in found if g.revoke_first})
        public = {row[0] for row in fetch_all(using, SQL["tables_open_to_public"],
                                               {"tables": exact})}
        todo.extend(f"REVOKE ALL ON {quote(table)} FROM PUBLIC;" for table in sorted(public))
        held = _held(using, existing, names.values())
        for grant in found:
            has = {p for p in TABLE_PRIVILEGES if (grant.table, grant.role, p) in held}
            if grant.revoke_first and (has != set(grant.privileges) or grant.table in public):
                todo.extend(_grant_lines(grant, grant.privileges))
            elif not grant.revoke_first and set(grant.privileges) - has:
                todo.extend(_grant_lines(grant, set(grant.privileges) - has))
        for statement in todo:
            affected(using, statement)
    return todo


@dataclass(frozen=True)
class Finding:
    """A difference between a role's privileges on a table and the matrix."""

    table: str
    role: str
    kinds: tuple[str, ...]
    privilege: str
    missing: bool  # False: an extra privilege

    @property
    def fix(self) -> str:
        if self.missing:
            return f"GRANT {self.privilege} ON {quote(self.table)} TO {quote(self.role)};"
        return f"REVOKE {self.privilege} ON {quote(self.table)} FROM {quote(self.role)};"


def compare(using: str) -> list[Finding]:
    """Each role's effective privileges on each table the matrix governs, against the matrix
    (project tables: missing ones only). Missing tables and roles are left out."""
    names = role_names()
    found = grants(None, names)
    if not found:
        return []
    existing = _existing(using, [g.table for g in found])
    held = _held(using, existing, names.values())
    present = set(_present(using, names).values())
    findings: list[Finding] = []
    for grant in found:
        if grant.table not in existing or grant.role not in present:
            continue
        for privilege in TABLE_PRIVILEGES:
            has = (grant.table, grant.role, privilege) in held
            wanted = privilege in grant.privileges
            if wanted and not has:
                findings.append(Finding(grant.table, grant.role, grant.kinds, privilege, True))
            elif has and not wanted and grant.revoke_first:
                findings.append(Finding(grant.table, grant.role, grant.kinds, privilege, False))
    return findings


def grant_after_migrate(
    sender: object, app_config: object = None, using: str = "default", verbosity: int = 1,
    **kwargs: object,
) -> None:
    """``post_migrate``: bring an app's rows of the matrix to the database, as their owner.

    Django sends it for every app with models after every ``migrate``, also when nothing was
    left to migrate; tenancy has none, so its rows come with every app's.
    """
    label = getattr(app_config, "label", None)
    if label is None or using not in settings.DATABASES:
        return
    labels = ["tenancy", label]
    if not grants(labels) or not owns_tables(using, labels):
        return
    run = apply(using, labels)
    if verbosity >= 1 and run:
        print(f"  Applied {len(run)} privilege statement(s) for {label} (docs/roles.md)")


#: The kinds whose roles must not create temporary objects: a temporary table left in a pooled
#: server session would take the place of a table of its name for the next borrower
#: (docs/roles.md, "Temporary tables").
NO_TEMPORARY = (APP, WORKER)


def database_name() -> str:
    """The database the roles work in: the app alias's ``NAME``."""
    return str(settings.DATABASES.get(tenancy_settings.APP_DATABASE, {}).get("NAME") or "")


def database_statements(
    database: str | None = None, roles: dict[str, str] | None = None
) -> list[str]:
    """The SQL that takes ``TEMPORARY`` away from the app and worker roles (from ``PUBLIC`` and
    from themselves), for the database's owner to run."""
    names = role_names() if roles is None else roles
    targets = list(dict.fromkeys(names[k] for k in NO_TEMPORARY if k in names))
    database = database_name() if database is None else database
    if not targets or not database:
        return []
    on = f"ON DATABASE {quote(database)}"
    return [
        f"REVOKE TEMPORARY {on} FROM PUBLIC;",
        f"REVOKE TEMPORARY {on} FROM {', '.join(quote(r) for r in targets)};",
    ]


def temporary_holders(using: str) -> list[tuple[str, str]]:
    """``(kind, role)`` of the existing app and worker roles that can create temporary tables
    in the alias's database (effective privileges: their own, inherited or PUBLIC's)."""
    names = {k: r for k, r in role_names().items() if k in NO_TEMPORARY}
    if not names:
        return []
    holding = {row[0] for row in fetch_all(using, SQL["temporary_holders"],
                                           {"roles": sorted(set(names.values()))})}
    return [(kind, role) for kind, role in names.items() if role in holding]


def owns_database(using: str) -> bool:
    """Whether ``using``'s role may revoke on its database (its owner, a member of it, or a
    superuser)."""
    row = fetch_one(using, SQL["owns_database"])
    return bool(row and row[0])


def apply_database(using: str) -> list[str] | None:
    """Take ``TEMPORARY`` away from the app and worker roles in ``using``'s database: the
    statements run, or None when ``using``'s role may not (not the database's owner)."""
    if not temporary_holders(using):
        return []
    if not owns_database(using):
        return None
    run = database_statements(fetch_one(using, SQL["current_database"])[0])
    with transaction.atomic(using=using):
        for statement in run:
            affected(using, statement)
    return run


def revoke_temporary_after_migrate(
    sender: object, app_config: object = None, using: str = "default", verbosity: int = 1,
    **kwargs: object,
) -> None:
    """``post_migrate``: :func:`apply_database`, after the library's apps' migrations."""
    label = getattr(app_config, "label", None)
    if label is None or label not in governed_apps() or using not in settings.DATABASES:
        return
    run = apply_database(using)
    if verbosity >= 2 and run:
        print("  Took TEMPORARY away from the app and worker roles (docs/roles.md)")
