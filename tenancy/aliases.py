"""Which database connection does what: one rule, asked everywhere.

Every module of the library that needs a connection asks one of these
functions, so ``TENANCY["APP_DATABASE"]`` and ``TENANCY["SYSTEM_DATABASE"]``
mean the same thing everywhere, whatever they are called.
"""

from __future__ import annotations

from django.conf import settings

from django_idempotency_outbox.errors import ConfigurationError
from tenancy.conf import tenancy_settings


def app_alias(using: str | None = None) -> str:
    """The alias of the web process's role, under row-level security.

    ``using`` wins when given (a caller's explicit choice); otherwise
    ``TENANCY["APP_DATABASE"]`` (``"default"`` unless set).
    """
    return using or tenancy_settings.APP_DATABASE


def system_alias(using: str | None = None) -> str:
    """The alias of the system role, which sees every tenant's rows of the library's tables.

    Raises:
        ConfigurationError: the alias is not in ``DATABASES``.
    """
    alias = using or tenancy_settings.SYSTEM_DATABASE
    if alias not in settings.DATABASES:
        raise ConfigurationError(
            f"Database alias {alias!r} is not configured: cross-tenant work (reaping, "
            "relaying, reading the outbox) needs a connection as the system role "
            '(TENANCY["SYSTEM_DATABASE"], docs/roles.md).'
        )
    return alias
