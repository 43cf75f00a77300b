"""The ``TENANCY`` settings dict (documented in docs/settings.md)."""

from __future__ import annotations

from typing import Any

from django_idempotency_outbox.conf import (
    AppSettings,
    Setting,
    dotted_path_or_object,
    http_status,
    optional,
    text,
)


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
    #: The status of the problem answer to a request on a tenant-scoped view
    #: (or an idempotent one) whose resolver names no tenant.
    STATUS_NO_TENANT = Setting(403, http_status)


tenancy_settings = TenancySettings()
