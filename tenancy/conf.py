"""The ``TENANCY`` settings dict (documented in docs/settings.md)."""

from __future__ import annotations

from typing import Any

from django_idempotency_outbox.conf import (
    AppSettings,
    Setting,
    boolean,
    dotted_path_or_object,
    http_status,
    optional,
    text,
    text_mapping,
)


def role_names(value: Any, label: str) -> dict[str, str]:
    """A dict naming the role of some of "app", "worker", "system"."""
    names = text_mapping(value, label)
    unknown = sorted(set(names) - {"app", "worker", "system"})
    if unknown:
        raise ValueError(f"{label}: unknown role kind(s) {unknown}; expected app, worker, system")
    return names


class TenancySettings(AppSettings):
    namespace = "TENANCY"

    #: Dotted path to (or the) callable(request) -> int | None naming the
    #: tenant of an authenticated request. Called after DRF authentication.
    TENANT_RESOLVER: Setting[Any] = Setting(None, optional(dotted_path_or_object))
    #: Alias of the web process's connection (the app role, under RLS).
    APP_DATABASE = Setting("default", text())
    #: Alias of the system role's connection, used for cross-tenant upkeep:
    #: reaping keys, relaying and reaping the outbox.
    SYSTEM_DATABASE = Setting("system", text())
    #: Alias of the workers' connection (consumers, relays): RLS-bound like the
    #: app role, and the only role that may lock, advance and lease offsets.
    WORKER_DATABASE = Setting("worker", text())
    #: Role names the library's grants and checks use, by kind ("app",
    #: "worker", "system"); a kind left out is the ``USER`` of its alias.
    ROLES: Setting[dict[str, str]] = Setting({}, role_names)
    #: Whether ``migrate`` (and ``grant_privileges``) also grants your own
    #: apps' tables: DML to the app role on every table of theirs, and to the
    #: worker role on the ``tenant_isolated`` ones (consumers' handlers write them).
    GRANT_PROJECT_TABLES = Setting(False, boolean)
    #: The status of the problem answer to a request on a tenant-scoped view
    #: (or an idempotent one) whose resolver names no tenant.
    STATUS_NO_TENANT = Setting(403, http_status)


tenancy_settings = TenancySettings()
