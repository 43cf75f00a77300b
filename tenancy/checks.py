"""System checks: is row-level security really in force? (docs/roles.md lists each id.)

RLS proves nothing if the web process connects as a superuser, as a role with
BYPASSRLS, or as the owner of the tables.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DatabaseError, router

from django_idempotency_outbox.conf import CheckIds, check
from django_idempotency_outbox.errors import ConfigurationError
from django_idempotency_outbox.observability import observability_settings
from tenancy.conf import tenancy_settings
from tenancy.db import (
    library_apps,  # the library's own apps: they pass their alias to every query themselves
    role_facts,
    table_facts,
    tenant_isolated_models,
    tenant_isolated_tables,
)


def register() -> None:
    checks.register(check_settings)
    checks.register(check_routing)
    checks.register(_unless_unreadable(check_database_roles), checks.Tags.database)
    checks.register(_unless_unreadable(check_privileges), checks.Tags.database)
    checks.register(_unless_unreadable(check_project_privileges), checks.Tags.database)
    checks.register(check_policy_declarations)
    checks.register(check_closed_tables)
    checks.register(_unless_unreadable(check_temporary), checks.Tags.database)
    checks.register(_unless_unreadable(check_role_drift), checks.Tags.database)


def _unless_unreadable(check: Any) -> Any:
    """``check``, skipped while ``TENANCY`` cannot be read (:func:`check_settings` says why)."""

    @functools.wraps(check)
    def guarded(*args: Any, **kwargs: Any) -> list[checks.CheckMessage]:
        try:
            tenancy_settings.invalid_keys()
        except ConfigurationError:
            return []  # not a dict: tenancy.E001
        if tenancy_settings.invalid_keys():
            return []  # a value that cannot be converted: tenancy.E007
        return check(*args, **kwargs)  # type: ignore[no-any-return]

    return guarded


def _is_postgresql(alias: str) -> bool:
    return settings.DATABASES[alias].get("ENGINE", "") in {
        "django.db.backends.postgresql", "django.contrib.gis.db.backends.postgis",
        "tenancy.backends.postgresql",  # tenancy.databases(): PostgreSQL's, tests made by the owner
    }


def _postgresql(databases: Sequence[str] | None) -> list[str]:
    """The aliases of ``databases`` that are configured PostgreSQL ones, in their order."""
    return [a for a in databases or () if a in settings.DATABASES and _is_postgresql(a)]


#: The ids under which tenancy reports its own settings dict (and the shared
#: package's OBSERVABILITY): each app reports its own dict under its own ids.
SETTINGS_CHECK_IDS = CheckIds(
    not_a_dict="tenancy.E001", unknown="tenancy.E002", invalid="tenancy.E007",
    removed="tenancy.E002",  # a key it does not take, the message naming what replaces it
)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for app_settings in (tenancy_settings, observability_settings):
        errors.extend(check(app_settings, SETTINGS_CHECK_IDS))
    try:
        app_alias = tenancy_settings.APP_DATABASE
        system_alias = tenancy_settings.SYSTEM_DATABASE
        admin_alias = tenancy_settings.ADMIN_DATABASE
    except ConfigurationError:
        return errors  # reported above (E001 or E007)
    if app_alias not in settings.DATABASES:
        errors.append(checks.Error(
            f'TENANCY["APP_DATABASE"] = {app_alias!r} is not in DATABASES.', id="tenancy.E003"))
    if system_alias not in settings.DATABASES:
        errors.append(checks.Warning(
            f'TENANCY["SYSTEM_DATABASE"] = {system_alias!r} is not in DATABASES: reaping '
            "idempotency keys and relaying the outbox need a connection as the system role.",
            hint="Add a DATABASES entry that logs in as the system role (docs/roles.md).",
            id="tenancy.W004",
        ))
    worker_alias = tenancy_settings.WORKER_DATABASE
    if worker_alias not in settings.DATABASES:
        errors.append(checks.Warning(
            f'TENANCY["WORKER_DATABASE"] = {worker_alias!r} is not in DATABASES: consumers '
            "and relays keep their offsets through a connection as the worker role.",
            hint="Add a DATABASES entry that logs in as the worker role (docs/roles.md).",
            id="tenancy.W019",
        ))
    if admin_alias is not None and admin_alias not in settings.DATABASES:
        errors.append(checks.Error(
            f'TENANCY["ADMIN_DATABASE"] = {admin_alias!r} is not in DATABASES: the admin\'s '
            "lists and the metrics' outbox gauges are read through it.",
            hint="Add its DATABASES entry, or leave the setting out (the system alias).",
            id="tenancy.E032",
        ))
    errors.extend(_check_distinct_roles())
    for alias in (app_alias, worker_alias, system_alias):
        if alias in settings.DATABASES and not _is_postgresql(alias):
            errors.append(checks.Error(
                f"DATABASES[{alias!r}] is not PostgreSQL: tenant isolation relies on "
                "PostgreSQL row-level security.", id="tenancy.E005"))
        elif alias in settings.DATABASES:
            errors.extend(_check_statement_layer(alias))
    if tenancy_settings.TENANT_RESOLVER is not None:
        from tenancy.resolver import get_resolver

        try:
            get_resolver()
        except Exception as exc:
            errors.append(checks.Error(str(exc), id="tenancy.E006"))
    return errors


def _check_statement_layer(alias: str) -> list[checks.CheckMessage]:
    """How the library sends its statements on ``alias`` (tenancy.statements): bound on the
    client, several to a message, by the library's backend."""
    found: list[checks.CheckMessage] = []
    config = settings.DATABASES[alias]
    if config.get("OPTIONS", {}).get("server_side_binding"):
        found.append(checks.Error(
            f'DATABASES[{alias!r}]["OPTIONS"]["server_side_binding"] is set: the library sends '
            "a statement that returns nothing (the tenant's SET LOCAL, a savepoint) in one "
            "message with the next, which a cursor that binds on the server cannot.",
            hint="Leave server_side_binding out (Django's default): the library's hot statements "
                 "are planned once per server session by its functions (docs/scaling.md).",
            id="tenancy.E045",
        ))
    if config.get("ENGINE") != "tenancy.backends.postgresql":
        found.append(checks.Warning(
            f"DATABASES[{alias!r}] uses ENGINE {config.get('ENGINE')!r}: the library's "
            "statements work there, but BEGIN, the tenant's SET LOCAL and each savepoint cost a "
            "round trip of their own (a new idempotency key four more).",
            hint='Use "tenancy.backends.postgresql", as tenancy.databases() writes it '
                 "(docs/installation.md).",
            id="tenancy.W046",
        ))
    return found


def _check_distinct_roles() -> list[checks.CheckMessage]:
    from tenancy.privileges import role_names

    names = role_names()
    errors: list[checks.CheckMessage] = []
    for kind in ("worker", "system"):
        if kind in names and names[kind] == names.get("app"):
            errors.append(checks.Error(
                f"The app role and the {kind} role are both {names[kind]!r}: the web "
                f"process would hold the {kind} role's privileges "
                + ("(the shared delivery state: offsets and leases)." if kind == "worker"
                   else "(every tenant's rows)."),
                hint="Give each its own role (docs/roles.md, TENANCY[\"ROLES\"]).",
                id="tenancy.E020",
            ))
    return errors


def check_routing(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Do the ORM's queries go where ``tenant_context`` sets the tenant? Elsewhere, row-level
    security shows no row and refuses every insert."""
    try:
        app_alias = tenancy_settings.APP_DATABASE
    except ConfigurationError:
        return []  # reported by check_settings
    if app_alias not in settings.DATABASES:
        return []  # tenancy.E003
    own = [m for m in tenant_isolated_models() if m._meta.app_label not in library_apps()]
    errors: list[checks.CheckMessage] = [checks.Error(
        f"{model._meta.label} is tenant-isolated, but the ORM writes it to {routed!r}, while "
        f'tenant_context sets the tenant on TENANCY["APP_DATABASE"] = {app_alias!r}: its '
        "queries would run outside the tenant's transaction.",
        hint='Add "tenancy.routers.AppDatabaseRouter" to DATABASE_ROUTERS, or route the model '
        "to the app alias yourself (docs/settings.md).",
        obj=model, id="tenancy.E008",
    ) for model in own if (routed := router.db_for_write(model)) != app_alias]
    errors.extend(_check_worker_routing(own))
    if not own and app_alias != "default" and not settings.DATABASE_ROUTERS:
        errors.append(checks.Warning(
            f'TENANCY["APP_DATABASE"] is {app_alias!r}, but DATABASE_ROUTERS is empty: '
            "Django sends every query without using() to 'default', not where "
            "tenant_context sets the tenant.",
            hint='Add "tenancy.routers.AppDatabaseRouter" to DATABASE_ROUTERS (docs/settings.md).',
            id="tenancy.W009",
        ))
    return errors


def _check_worker_routing(own: list[Any]) -> list[checks.CheckMessage]:
    """Inside a worker's batch (an outbox consumer's): do the ORM's writes go to its alias?"""
    from tenancy.aliases import working_as_worker

    worker = tenancy_settings.WORKER_DATABASE
    if worker not in settings.DATABASES:
        return []  # no worker alias: nothing runs a worker's batch
    with working_as_worker(worker):
        return [checks.Error(
            f"{model._meta.label} is tenant-isolated, but inside a consumer's batch the ORM "
            f"writes it to {routed!r}, not to the batch's transaction on "
            f'TENANCY["WORKER_DATABASE"] = {worker!r}: a handler\'s writes would not commit '
            "with its offset advance.",
            hint='Add "tenancy.routers.AppDatabaseRouter" to DATABASE_ROUTERS (docs/consumers.md).',
            obj=model, id="tenancy.E021",
        ) for model in own if (routed := router.db_for_write(model)) != worker]


def _not_inspected(alias: str, exc: DatabaseError) -> list[checks.CheckMessage]:
    """``tenancy.E010`` for ``alias``, unless check_database_roles reports it (once, not twice)."""
    if alias in (tenancy_settings.APP_DATABASE, tenancy_settings.WORKER_DATABASE,
                 tenancy_settings.SYSTEM_DATABASE):
        return []
    return [checks.Error(f"Could not inspect database {alias!r}: {exc}", id="tenancy.E010")]


def check_privileges(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Each role's privileges on each library table, against ``tenancy.privileges.matrix()``.

    Through the tables' owner's alias they are one warning (``tenancy.W027``): ``migrate`` runs
    its checks before it applies the matrix, so it must not stop on them.
    """
    from tenancy.privileges import compare, owns_tables

    aliases = _postgresql(databases)
    if not aliases:
        return []
    try:
        findings = compare(aliases[0])
        if findings and owns_tables(aliases[0]):
            return [_will_apply(aliases[0], findings)]
    except DatabaseError as exc:
        return _not_inspected(aliases[0], exc)
    return [checks.Error(
        f"Role {f.role!r} ({'/'.join(f.kinds) or 'no kind'}) "
        + (f"lacks {f.privilege} on {f.table}." if f.missing else f"has {f.privilege} on "
           f"{f.table}, which the library's privilege matrix does not give it (docs/roles.md)."),
        hint=f"Run, as the owner: {f.fix} (or manage.py grant_privileges).",
        id="tenancy.E017" if f.missing else "tenancy.E018",
    ) for f in findings]


def _will_apply(alias: str, findings: Sequence[Any]) -> checks.CheckMessage:
    shown = "; ".join(
        f"{f.role} {'lacks' if f.missing else 'has'} {f.privilege} on {f.table}"
        for f in findings[:3]
    )
    more = f" and {len(findings) - 3} more" if len(findings) > 3 else ""
    return checks.Warning(
        f"{len(findings)} privilege(s) differ from the privilege matrix ({shown}{more}).",
        hint=f"migrate --database {alias} applies the matrix when it ends (so does "
        f"manage.py grant_privileges --database {alias}): docs/roles.md.",
        id="tenancy.W027",
    )


def check_project_privileges(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """With ``GRANT_PROJECT_TABLES`` off, a table of yours the app role holds no privilege on
    (almost always a forgotten grant: every request that touches it answers 500)."""
    from tenancy.privileges import role_names

    if tenancy_settings.GRANT_PROJECT_TABLES:
        return []  # migrate grants them; check_privileges compares
    aliases = _postgresql(databases)
    role = role_names().get("app")
    if not aliases or not role:
        return []
    from django.apps import apps

    from tenancy.context import SQL
    from tenancy.statements import fetch_all

    governed = library_apps()
    tables = sorted({
        m._meta.db_table for m in apps.get_models(include_auto_created=True)
        if m._meta.app_label not in governed and m._meta.managed and not m._meta.proxy
    })
    try:
        bare = [row[0] for row in fetch_all(aliases[0], SQL["closed_project_tables"],
                                            {"role": role, "tables": tables})]
    except DatabaseError:
        return []  # check_database_roles reports an alias it cannot inspect (tenancy.E010)
    if not bare:
        return []
    shown = ", ".join(bare[:5]) + (f" and {len(bare) - 5} more" if len(bare) > 5 else "")
    return [checks.Warning(
        f"The app role {role!r} has no privilege on {len(bare)} table(s) of your apps "
        f"({shown}): every query of the web process on them fails.",
        hint='Set TENANCY["GRANT_PROJECT_TABLES"] = True and run migrate as the owner, or '
        "grant them yourself (docs/roles.md).",
        id="tenancy.W028",
    )]


def check_closed_tables(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Which tables of yours does ``GRANT_PROJECT_TABLES`` leave closed, for want of RLS?"""
    from tenancy.privileges import closed_tables

    try:
        if not tenancy_settings.GRANT_PROJECT_TABLES:
            return []
        closed = closed_tables()
    except ConfigurationError:
        return []  # tenancy.E001 or E007
    if not closed:
        return []
    shown = ", ".join(closed[:8]) + (f" and {len(closed) - 8} more" if len(closed) > 8 else "")
    return [checks.Warning(
        f"GRANT_PROJECT_TABLES leaves {len(closed)} table(s) of your apps closed to the app "
        f"role ({shown}): they have no row-level security, so the web role would read and "
        "write every tenant's rows in them.",
        hint='Make a model that holds a tenant\'s rows tenant_isolated = True (docs/roles.md); '
        'list a table that holds none, or that the web process reads before it knows the '
        'tenant (users, tokens, sessions), in TENANCY["SHARED_TABLES"] (an app label or a '
        "table name).",
        id="tenancy.W040",
    )]


def check_policy_declarations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A tenant-isolated model of yours needs a ``tenant_id`` column of its own."""
    from tenancy.policies import declares_policy

    errors: list[checks.CheckMessage] = []
    governed = library_apps()
    for model in tenant_isolated_models():
        meta = model._meta
        if meta.app_label in governed or not meta.managed or meta.proxy:
            continue
        if not declares_policy(model):
            errors.append(checks.Error(
                f"{meta.label} declares tenant_isolated = True, but its table {meta.db_table} "
                "has no tenant_id column of its own: no policy can be written for it.",
                hint="Give the model a tenant_id field (a BigIntegerField), or remove "
                "tenant_isolated (a multi-table child inherits it from its parent).",
                obj=model,
                id="tenancy.E029",
            ))
    return errors


def check_temporary(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Can the app or worker role still create temporary tables (``tenancy.E030``)?

    Asked on the first alias named that is not the database's owner: ``migrate`` connected as
    the owner takes the privilege away itself, after its checks.
    """
    from tenancy import privileges

    aliases = _postgresql(databases)
    holders: list[tuple[str, str]] = []
    for alias in aliases:
        try:
            if privileges.owns_database(alias):
                continue
            holders = privileges.temporary_holders(alias)
        except DatabaseError as exc:
            # check_privileges asked the first alias named, and reported it.
            return [] if alias == aliases[0] else _not_inspected(alias, exc)
        break
    if not holders:
        return []
    database = privileges.database_name()
    fix = " ".join(privileges.database_statements(database))
    return [checks.Error(
        f"Role {role!r} ({kind}) can create temporary tables in database "
        f"{database!r} (TEMPORARY, which PostgreSQL gives PUBLIC by default): a "
        "temporary table left in a pooled server session would take the place of a table "
        "of the same name for the session's next borrower.",
        hint=f"Run, as the database's owner: {fix} (or manage.py grant_privileges, or "
        "migrate, connected as it).",
        id="tenancy.E030",
    ) for kind, role in holders]


def check_database_roles(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    tables = tenant_isolated_tables()
    seen: set[tuple[str, str]] = set()  # a table's finding once, whichever aliases looked
    for alias in _postgresql(databases):
        try:
            if alias in (tenancy_settings.APP_DATABASE, tenancy_settings.WORKER_DATABASE):
                found = list(_check_app_alias(alias, tables))
            elif alias == tenancy_settings.SYSTEM_DATABASE:
                found = list(_check_system_alias(alias, tables))
            else:
                found = []
        except DatabaseError as exc:
            found = [
                checks.Error(f"Could not inspect database {alias!r}: {exc}", id="tenancy.E010")
            ]
        for message in found:
            if (message.id or "", message.msg) not in seen:
                seen.add((message.id or "", message.msg))
                errors.append(message)
    return errors


def _check_app_alias(alias: str, tables: list[str]) -> Iterable[checks.CheckMessage]:
    role = role_facts(alias)
    if role.superuser:
        yield checks.Error(
            f"Database {alias!r} connects as {role.name!r}, a superuser: row-level security "
            "does not apply to it, so tenants are not isolated.",
            hint="Connect the web process as a role with NOSUPERUSER NOBYPASSRLS (docs/roles.md).",
            id="tenancy.E011",
        )
    if role.bypassrls:
        yield checks.Error(
            f"Database {alias!r} connects as {role.name!r}, which has BYPASSRLS: tenants are "
            "not isolated.",
            hint=f"ALTER ROLE {role.name} NOBYPASSRLS; or use another role (docs/roles.md).",
            id="tenancy.E012",
        )
    facts = table_facts(alias, tables)
    for table in tables:
        fact = facts.get(table)
        if fact is None:
            continue  # not migrated yet
        if fact.owned_by_current_role:
            yield checks.Error(
                f"Database {alias!r} connects as {role.name!r}, which owns (or is a member of "
                f"the owner of) {table}: an owner can switch row-level security off.",
                hint="Run migrations as a separate owner role (docs/roles.md).",
                id="tenancy.E013",
            )
        yield from _check_table_rls(fact)
    yield from _check_verified_context(alias, facts)


def _check_verified_context(alias: str, facts: dict[str, Any]) -> Iterable[checks.CheckMessage]:
    """Do the settings and the database agree on the verified tenant context?"""
    from tenancy import verified

    key = tenancy_settings.VERIFIED_CONTEXT
    mode = verified.database_mode(alias)
    if mode is None:
        if key is not None:
            yield checks.Error(
                'TENANCY["VERIFIED_CONTEXT"] is set, but tenancy\'s migration has not run on '
                f"{alias!r}.",
                hint="Run manage.py migrate as the owner.",
                id="tenancy.E022",
            )
        return
    if key is not None and mode == "plain":
        yield checks.Error(
            'TENANCY["VERIFIED_CONTEXT"] is set, but the database is in the plain mode: its '
            "policies trust app.tenant_id, which injected SQL can set to any tenant.",
            hint="As the owner: manage.py verified_context add-key, then "
            "manage.py verified_context enable (docs/roles.md).",
            id="tenancy.E022",
        )
    if key is None and mode == "verified":
        yield checks.Error(
            "The database is in the verified mode, but TENANCY[\"VERIFIED_CONTEXT\"] is not "
            "set: no request gets a token, so every query sees no tenant's rows.",
            hint='Set TENANCY["VERIFIED_CONTEXT"] to an installed key, or as the owner: '
            "manage.py verified_context disable.",
            id="tenancy.E023",
        )
    if key is not None and mode == "verified" and not verified.accepts(alias, key):
        yield checks.Error(
            f'The database does not accept tokens signed with TENANCY["VERIFIED_CONTEXT"]\'s '
            f"key {key.key_id!r} (not installed, or installed with another secret): every "
            "query sees no tenant's rows.",
            hint="As the owner: manage.py verified_context add-key (docs/roles.md).",
            id="tenancy.E024",
        )
    if mode == "verified":
        for table, fact in sorted(facts.items()):
            if fact.setting_policies:
                yield checks.Error(
                    f"Table {table} has a policy that reads app.tenant_id itself: in the "
                    "verified mode, injected SQL can still set that to any tenant.",
                    hint="Compare tenant_id with (SELECT tenancy_current_tenant()) in its USING "
                    "and WITH CHECK (docs/roles.md).",
                    id="tenancy.E025",
                )
        if verified.readable_keys(alias):
            yield checks.Error(
                f"Database {alias!r} can read the keys of the verified tenant context "
                "(tenancy_context_keys): injected SQL could sign any tenant's token.",
                hint="Keep row-level security on tenancy_context_keys enabled and never grant "
                "it BYPASSRLS (docs/roles.md).",
                id="tenancy.E026",
            )


def _check_table_rls(fact: Any) -> Iterable[checks.CheckMessage]:
    if not (fact.rls_enabled and fact.rls_forced and fact.policies) or fact.other_policies:
        yield checks.Error(
            f"Table {fact.name} does not have row-level security enabled and forced with "
            f"only the tenant policy the migrations install (enabled={fact.rls_enabled}, "
            f"forced={fact.rls_forced}, policies={fact.policies}, "
            f"others={fact.other_policies}: permissive policies whose USING or WITH CHECK "
            "is not exactly tenant_id = (SELECT tenancy_current_tenant())).",
            hint=_rls_hint(fact.name),
            id="tenancy.E014",
        )


def _rls_hint(table: str) -> str:
    app_label = next(
        (m._meta.app_label for m in tenant_isolated_models() if m._meta.db_table == table), ""
    )
    if app_label in library_apps():
        return "Run the library's migrations; never edit their SQL."
    return (
        f"Run manage.py makemigrations {app_label} and migrate as the owner: the model's "
        "tenant_isolated = True gives its table the policy of docs/roles.md in a migration."
    )


def _check_system_alias(alias: str, tables: list[str]) -> Iterable[checks.CheckMessage]:
    role = role_facts(alias)
    if role.superuser:
        yield checks.Error(
            f"Database {alias!r} connects as {role.name!r}, a superuser. The system role "
            "needs only to read and delete the library's rows across tenants.",
            hint="Use a NOSUPERUSER role with BYPASSRLS and grants on the library's tables.",
            id="tenancy.E015",
        )
    facts = table_facts(alias, tables)
    for table, fact in sorted(facts.items()):
        if fact.rls_active:
            yield checks.Error(
                f"Database {alias!r} connects as {role.name!r}, which is subject to row-level "
                f"security on {table}: cross-tenant upkeep would see one tenant at most.",
                hint=f"ALTER ROLE {role.name} BYPASSRLS; (docs/roles.md).",
                id="tenancy.E016",
            )
        yield from _check_table_rls(fact)


def check_role_drift(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Do the app, worker and system roles still look as ``create_roles`` made them?

    The web role may change its own settings for every later session (``ALTER ROLE CURRENT_USER
    SET ...``). Asked on the first alias named (the catalogs are readable by every role).
    """
    from tenancy.provision import role_drift

    aliases = _postgresql(databases)
    if not aliases:
        return []
    try:
        found = role_drift(aliases[0])
    except DatabaseError:
        return []  # check_database_roles reports an alias it cannot inspect (tenancy.E010)
    messages: list[checks.CheckMessage] = []
    for d in found:
        hint = f"Run, as a superuser: {d.fix} (or manage.py create_roles, which puts it back)."
        ids = ("tenancy.E043", "tenancy.W044") if d.attribute else ("tenancy.E041", "tenancy.W042")
        level, id_ = (checks.Error, ids[0]) if d.breaks else (checks.Warning, ids[1])
        why = f": {d.breaks}" if d.breaks else ""
        messages.append(level(f"The {d.said}{why}.", hint=hint, id=id_))
    return messages
