"""Namespaced settings, read live from ``django.conf.settings``.

Each app declares its defaults once, as a dict, and reads its settings
through one :class:`AppSettings` object::

    idempotency_settings = AppSettings("IDEMPOTENCY", DEFAULTS)
    idempotency_settings.TTL  # settings.IDEMPOTENCY["TTL"] or the default

Values are looked up on every access, so ``override_settings`` and
``pytest-django``'s ``settings`` fixture take effect at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class AppSettings:
    def __init__(self, name: str, defaults: Mapping[str, Any]) -> None:
        self.name = name
        self.defaults = dict(defaults)

    def user_settings(self) -> Mapping[str, Any]:
        value = getattr(settings, self.name, {})
        if type(value) is not dict and not isinstance(value, Mapping):
            raise ImproperlyConfigured(f"settings.{self.name} must be a dict.")
        return value

    def unknown_keys(self) -> list[str]:
        return sorted(set(self.user_settings()) - set(self.defaults))

    def __getattr__(self, key: str) -> Any:
        if key not in self.defaults:
            raise AttributeError(f"{self.name} has no setting {key!r}")
        return self.user_settings().get(key, self.defaults[key])

    def __repr__(self) -> str:
        return f"<AppSettings {self.name}>"


DEFAULTS: dict[str, Any] = {
    # Dotted path to a callable(request) -> int | None that names the tenant of
    # an authenticated request. Called after DRF authentication.
    "TENANT_RESOLVER": None,
    # Alias of the web process's connection (the app role, under RLS).
    "APP_DATABASE": "default",
    # Alias of the system role's connection, used for cross-tenant upkeep:
    # reaping keys, relaying and reaping the outbox.
    "SYSTEM_DATABASE": "system",
}

tenancy_settings = AppSettings("TENANCY", DEFAULTS)
