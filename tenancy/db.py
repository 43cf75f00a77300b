"""What the database says about the roles and tables in use, and the one guard built on it.

Catalog queries (``pg_roles``, ``pg_class``, ``pg_policy``), which the
system checks and the cross-tenant guard read, and one query on a table the
caller names (:func:`tenants_with_rows`, the reapers' walk over tenants).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from django.apps import apps
from django.conf import settings
from django.db import connections
from django.db.models import Model

from django_idempotency_outbox.errors import ConfigurationError
from django_idempotency_outbox.sqlfiles import queries
from tenancy.context import pinned_schemas
from tenancy.exceptions import CrossTenantRefused
from tenancy.statements import fetch_all, fetch_one

#: tenancy's statements, by name (tenancy/queries.sql).
SQL = queries("tenancy")


def library_apps() -> frozenset[str]:
    """The apps whose tables' policies come from their own migrations (tenancy's matrix)."""
    from tenancy.privileges import governed_apps

    return governed_apps()


@dataclass(frozen=True)
class RoleFacts:
    name: str
    superuser: bool
    bypassrls: bool


@dataclass(frozen=True)
class TableFacts:
    name: str
    owned_by_current_role: bool
    rls_enabled: bool
    rls_forced: bool
    policies: int
    other_policies: int  # permissive policies not exactly as the migrations install them
    setting_policies: int  # policies that read app.tenant_id themselves (forgeable)
    rls_active: bool


def tenant_isolated_models() -> list[type[Model]]:
    """Installed models that declare ``tenant_isolated = True`` (the library's tables)."""
    return [m for m in apps.get_models() if getattr(m, "tenant_isolated", False)]


def tenant_isolated_tables() -> list[str]:
    return sorted(m._meta.db_table for m in tenant_isolated_models())


def role_facts(using: str) -> RoleFacts:
    name, superuser, bypassrls = fetch_one(using, SQL["role_facts"])
    return RoleFacts(name, superuser, bypassrls)


#: The policy expressions the migrations install, as PostgreSQL prints them
#: back (``pg_get_expr``), ``{schema}`` standing for the function's schema when
#: the session's search_path does not show it (then PostgreSQL qualifies the
#: name). The library's tables and the docs' recommendation for yours compare
#: with ``tenancy_current_tenant()``; a table of yours may still compare with
#: the setting itself (the docs' first version), which the plain mode accepts.
POLICY_EXPRESSIONS = (
    "(tenant_id = ( SELECT {schema}tenancy_current_tenant() AS tenancy_current_tenant))",
    "(tenant_id = ( SELECT (NULLIF(current_setting('app.tenant_id'::text, true),"
    " ''::text))::bigint AS \"nullif\"))",
)


def _normalised(expression: str | None) -> str | None:
    return None if expression is None else " ".join(expression.split())


def isolating_expressions(schema: str, *, library: bool = False) -> frozenset[str]:
    """The expressions (normalised) a policy of a table in ``schema`` may have: exactly these.

    The library's own tables: the function form only (their migrations install it).
    """
    plain = re.fullmatch(r"[a-z_][a-z0-9_$]*", schema)
    qualified = (schema if plain else '"' + schema.replace('"', '""') + '"') + "."
    forms = POLICY_EXPRESSIONS[:1] if library else POLICY_EXPRESSIONS
    return frozenset(
        " ".join(e.format(schema=prefix).split())
        for e in forms
        for prefix in ("", qualified)
    )


def isolating(using_expression: str | None, check_expression: str | None, schema: str, *,
              library: bool = False) -> bool:
    """Whether a permissive policy's USING and WITH CHECK are exactly what the migrations install.

    Not a pattern: ``tenant_id = (SELECT tenancy_current_tenant()) OR true``
    mentions the tenant and lets every row through. WITH CHECK may be absent
    (PostgreSQL then checks writes with USING).
    """
    allowed = isolating_expressions(schema, library=library)
    qual, check = _normalised(using_expression), _normalised(check_expression)
    return qual in allowed and (check is None or check in allowed)


def table_facts(using: str, tables: list[str]) -> dict[str, TableFacts]:
    """Catalog facts for ``tables`` that exist in the alias's schema.

    The schema is the first of those the alias's sessions start with
    (:func:`tenancy.context.pinned_schemas`), not ``current_schema()``: a
    session's ``search_path`` may have been changed by an earlier borrower of
    a pooled server session, and ``current_schema()`` of a path that starts
    with ``pg_temp`` tries to create the temporary schema.

    A permissive policy counts among ``other_policies`` unless its USING and
    WITH CHECK are exactly those the migrations install (:func:`isolating`);
    restrictive policies can only narrow what the permissive ones open.
    """
    schema = pinned_schemas(using)[0]
    rows = fetch_all(using, SQL["table_facts"], {"tables": tables, "schema": schema})
    governed = library_apps()
    library = {m._meta.db_table for m in tenant_isolated_models()
               if m._meta.app_label in governed}
    facts = {}
    for name, owned, enabled, forced, active, nspname, permissive, quals, checks in rows:
        policies = list(zip(permissive, quals, checks, strict=True))
        other = sum(1 for open_, qual, check in policies
                    if open_ and not isolating(qual, check, nspname, library=name in library))
        setting = sum(1 for _, qual, check in policies
                      if "app.tenant_id" in (qual or "") or "app.tenant_id" in (check or ""))
        facts[name] = TableFacts(name, owned, enabled, forced, len(policies), other, setting,
                                 active)
    return facts


def tenants_with_rows(using: str, table: str) -> list[int]:
    """The distinct tenants of ``table`` (a library table), in order.

    A loose index scan on the index that ``tenant_id`` leads: one index probe
    per tenant, however many rows each has. Needs an alias that sees every
    tenant (the system role).
    """
    if table not in tenant_isolated_tables():
        raise ValueError(f"{table!r} is not a tenant-isolated table")
    statement = SQL["tenants_with_rows"].format(table=connections[using].ops.quote_name(table))
    return [row[0] for row in fetch_all(using, statement)]


def require_cross_tenant(alias: str, tables: Sequence[str], *, job: str) -> None:
    """Refuse cross-tenant ``job`` on an alias that row-level security confines.

    The one answer to "may this alias see every tenant's rows of ``tables``?",
    asked by every cross-tenant job (reapers, relay, stream reads, completer)
    before its first statement.

    Args:
        alias: the database alias the job would use.
        tables: the library tables it reads or deletes across tenants.
        job: what is refused, for the message (``"the key reaper"``).

    Raises:
        ConfigurationError: the alias is not configured, or a table is missing
            (migrations not run).
        CrossTenantRefused: RLS applies to the alias's role on one of ``tables``.
    """
    if alias not in settings.DATABASES:
        raise ConfigurationError(
            f"Database alias {alias!r} is not configured: {job} needs a connection as the "
            'system role (TENANCY["SYSTEM_DATABASE"], docs/roles.md).'
        )
    facts = table_facts(alias, list(tables))
    missing = [table for table in tables if table not in facts]
    if missing:
        raise ConfigurationError(f"{', '.join(missing)} does not exist: run manage.py migrate")
    confined = [table for table in tables if facts[table].rls_active]
    if confined:
        role = role_facts(alias).name
        raise CrossTenantRefused(
            f"Database alias {alias!r} connects as {role!r}, which is subject to row-level "
            f"security on {', '.join(confined)}: {job} cannot see other tenants' rows. Use the "
            'system role (TENANCY["SYSTEM_DATABASE"], docs/roles.md).'
        )
