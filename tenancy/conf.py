"""The ``TENANCY`` settings dict (documented in docs/settings.md)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from django_idempotency_outbox.conf import (
    AppSettings,
    Setting,
    boolean,
    dotted_path_or_object,
    http_status,
    optional,
    secret,
    text,
    text_mapping,
    texts,
)

_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class ContextKey:
    """The key that the web process signs tenant tokens with (``TENANCY["VERIFIED_CONTEXT"]``)."""

    key_id: str
    secret: bytes = field(repr=False)

    def pads(self) -> tuple[bytes, bytes]:
        """HMAC-SHA256's inner and outer padded keys, as the database keeps them."""
        key = self.secret if len(self.secret) <= 64 else hashlib.sha256(self.secret).digest()
        key = key.ljust(64, b"\0")
        return bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)


def verified_context(value: Any, label: str) -> ContextKey | None:
    """None (plain mode), or ``{"KEY_ID": str, "KEY": str}``: the signing key."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f'{label} must be None or a dict {{"KEY_ID": ..., "KEY": ...}}, not a '
                        f"{type(value).__name__}")
    unknown = sorted(set(value) - {"KEY_ID", "KEY"})
    if unknown:
        raise ValueError(f"{label} has unknown keys {unknown}; it takes KEY_ID and KEY")
    key_id = value.get("KEY_ID")
    if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
        raise ValueError(
            f'{label}["KEY_ID"] must be 1 to 64 letters, digits, "-" or "_", not {key_id!r}'
        )
    return ContextKey(key_id, secret(value.get("KEY"), f'{label}["KEY"]'))


def role_names(value: Any, label: str) -> dict[str, str]:
    """A dict naming the role of some of "app", "worker", "system"."""
    names = text_mapping(value, label)
    unknown = sorted(set(names) - {"app", "worker", "system"})
    if unknown:
        raise ValueError(f"{label}: unknown role kind(s) {unknown}; expected app, worker, system")
    return names


_PARAMETER = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?")


def role_settings(value: Any, label: str) -> dict[str, dict[str, str]]:
    """``{kind: {parameter: value}}``: the role-level settings of some of app, worker, system."""
    if not isinstance(value, dict):
        raise TypeError(f"{label} must be a dict {{kind: {{parameter: value}}}}, not {value!r}")
    unknown = sorted(set(value) - {"app", "worker", "system"})
    if unknown:
        raise ValueError(f"{label}: unknown role kind(s) {unknown}; expected app, worker, system")
    result: dict[str, dict[str, str]] = {}
    for kind, parameters in value.items():
        if not isinstance(parameters, dict):
            raise TypeError(f"{label}[{kind!r}] must be a dict {{parameter: value}}")
        for name, setting in parameters.items():
            if not (isinstance(name, str) and _PARAMETER.fullmatch(name)):
                raise ValueError(f"{label}[{kind!r}]: {name!r} is not a parameter's name")
            if not isinstance(setting, str):
                raise TypeError(f"{label}[{kind!r}][{name!r}] must be a string (as PostgreSQL "
                                f"stores it, e.g. \"30s\"), not {setting!r}")
        result[kind] = dict(parameters)
    return result


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
    #: Alias of the cross-tenant reads for people and monitors: the admin's
    #: lists (idempotency keys, parked messages, readers) and the metrics'
    #: outbox gauges. None: SYSTEM_DATABASE. Better: a role of its own with
    #: BYPASSRLS and SELECT only, so the web process holds no DELETE anywhere.
    ADMIN_DATABASE = Setting(None, optional(text()))
    #: None: staff see every tenant's rows in the library's admin pages. Else
    #: the dotted path to (or the) callable(request) -> iterable of tenant ids
    #: | None naming the tenants a staff user may see and act on there
    #: (tenancy.admin; None from the callable: every tenant).
    ADMIN_TENANTS: Setting[Any] = Setting(None, optional(dotted_path_or_object))
    #: Role names the library's grants and checks use, by kind ("app",
    #: "worker", "system"); a kind left out is the ``USER`` of its alias.
    ROLES: Setting[dict[str, str]] = Setting({}, role_names)
    #: Whether ``migrate`` (and ``grant_privileges``) also grants your own
    #: apps' tables: DML to the app role on every table of theirs, and to the
    #: worker role on the ``tenant_isolated`` ones (consumers' handlers write them).
    GRANT_PROJECT_TABLES = Setting(False, boolean)
    #: The tables of your apps (and Django's) that ``GRANT_PROJECT_TABLES``
    #: opens to the app role although they have no row-level security: app
    #: labels (``"auth"``: every table of the app) or table names. List only
    #: tables that hold no tenant's rows, or that the web process must read
    #: before it knows the tenant (users, tokens, sessions, memberships):
    #: the web role reads and writes every row of them, in every mode. Any
    #: other table without row-level security is not opened (``tenancy.W040``).
    SHARED_TABLES: Setting[tuple[str, ...]] = Setting((), texts)
    #: The role-level settings of the app, worker and system roles, by kind:
    #: ``{"app": {"statement_timeout": "30s"}}``. ``create_roles`` sets exactly
    #: these (and resets any other), and ``check`` reports a role whose
    #: settings differ (``tenancy.E041``, ``W042``): the web role may change its
    #: own with ``ALTER ROLE CURRENT_USER SET``, for every later session.
    ROLE_SETTINGS: Setting[dict[str, dict[str, str]]] = Setting({}, role_settings)
    #: The status of the problem answer to a request on a tenant-scoped view
    #: (or an idempotent one) whose resolver names no tenant.
    STATUS_NO_TENANT = Setting(403, http_status)
    #: None: the policies trust the setting app.tenant_id (plain mode). A dict
    #: {"KEY_ID": ..., "KEY": ...}: tenant_context also sets a token MACed with
    #: this key and bound to the transaction, which the database verifies once
    #: the owner has installed the key and turned the mode on (docs/roles.md).
    VERIFIED_CONTEXT: Setting[ContextKey | None] = Setting(None, verified_context)


tenancy_settings = TenancySettings()
