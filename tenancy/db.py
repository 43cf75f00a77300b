"""What the database says about the roles and tables in use."""

from __future__ import annotations

from dataclasses import dataclass

from django.apps import apps
from django.db import connections
from django.db.models import Model


@dataclass(frozen=True)
class RoleFacts:
    name: str
    superuser: bool
    bypassrls: bool


@dataclass(frozen=True)
class TableFacts:
    name: str
    owner: str
    owned_by_current_role: bool
    rls_enabled: bool
    rls_forced: bool
    policies: int
    other_policies: int  # policies that do not compare with app.tenant_id
    rls_active: bool


def tenant_isolated_models() -> list[type[Model]]:
    """Installed models that declare ``tenant_isolated = True`` (the library's tables)."""
    return [m for m in apps.get_models() if getattr(m, "tenant_isolated", False)]


def tenant_isolated_tables() -> list[str]:
    return sorted(m._meta.db_table for m in tenant_isolated_models())


def role_facts(using: str) -> RoleFacts:
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT rolname, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
        )
        name, superuser, bypassrls = cursor.fetchone()
    return RoleFacts(name, superuser, bypassrls)


def table_facts(using: str, tables: list[str]) -> dict[str, TableFacts]:
    """Catalog facts for ``tables`` that exist in the current schema."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname,
                   pg_get_userbyid(c.relowner),
                   pg_has_role(current_user, c.relowner, 'MEMBER'),
                   c.relrowsecurity,
                   c.relforcerowsecurity,
                   (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid),
                   (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid
                       AND NOT (coalesce(pg_get_expr(p.polqual, p.polrelid), '')
                                LIKE '%%app.tenant_id%%'
                            AND coalesce(pg_get_expr(p.polwithcheck, p.polrelid),
                                         pg_get_expr(p.polqual, p.polrelid), '')
                                LIKE '%%app.tenant_id%%')),
                   row_security_active(c.oid)
              FROM pg_class c
             WHERE c.relname = ANY(%s)
               AND c.relkind IN ('r', 'p')
               AND c.relnamespace = current_schema()::regnamespace
            """,
            [tables],
        )
        return {row[0]: TableFacts(*row) for row in cursor.fetchall()}


_TENANTS = """
WITH RECURSIVE t(tenant_id) AS (
    (SELECT tenant_id FROM {table} ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT r.tenant_id FROM {table} r
             WHERE r.tenant_id > t.tenant_id ORDER BY r.tenant_id LIMIT 1)
      FROM t WHERE t.tenant_id IS NOT NULL
)
SELECT tenant_id FROM t WHERE tenant_id IS NOT NULL
"""


def tenants_with_rows(using: str, table: str) -> list[int]:
    """The distinct tenants of ``table`` (a library table), in order.

    A loose index scan on the index that ``tenant_id`` leads: one index probe
    per tenant, however many rows each has. Needs an alias that sees every
    tenant (the system role).
    """
    if table not in tenant_isolated_tables():
        raise ValueError(f"{table!r} is not a tenant-isolated table")
    with connections[using].cursor() as cursor:
        cursor.execute(_TENANTS.format(table=table))
        return [row[0] for row in cursor.fetchall()]
