"""Which database connection does what: one rule, asked everywhere.

Every module of the library that needs a connection asks one of these
functions, so ``TENANCY["APP_DATABASE"]``, ``TENANCY["WORKER_DATABASE"]`` and
``TENANCY["SYSTEM_DATABASE"]`` mean the same thing everywhere, whatever they
are called (docs/roles.md, "Which process connects as which role"):

- the app alias: the web process and the broker's receivers, under
  row-level security, with no privilege on the shared delivery state;
- the worker alias: consumers and relays, under row-level security too, the
  only role that may lock, advance and lease offsets. A consumer's batch is
  one transaction on it: the offset lock, the handlers (in their tenants'
  contexts) and the offset advance;
- the system alias: cross-tenant reads and upkeep (stream, status, reapers);
- the admin alias: cross-tenant reads for people and monitors (the admin's
  lists, the metrics' gauges), the system alias unless
  ``TENANCY["ADMIN_DATABASE"]`` names a read-only one.

:func:`tenant_alias` is where tenant work runs *now*: the app alias, or the
worker alias while :func:`working_as_worker` is open (a consumer's batch), so
that ``tenant_context()``, ``publish()`` and the ORM (through
``tenancy.routers.AppDatabaseRouter``) follow the batch's transaction.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings

from django_idempotency_outbox.errors import ConfigurationError
from tenancy.conf import tenancy_settings

_working_on: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tenancy_working_on", default=None
)


def app_alias(using: str | None = None) -> str:
    """The alias of the web process's role, under row-level security.

    ``using`` wins when given (a caller's explicit choice); otherwise
    ``TENANCY["APP_DATABASE"]`` (``"default"`` unless set).
    """
    return using or tenancy_settings.APP_DATABASE


def _configured(alias: str, needed_for: str) -> str:
    if alias not in settings.DATABASES:
        raise ConfigurationError(
            f"Database alias {alias!r} is not configured: {needed_for} (docs/roles.md).")
    return alias


def worker_alias(using: str | None = None) -> str:
    """The alias of the workers' role (consumers, relays), under row-level security.

    Raises:
        ConfigurationError: the alias is not in ``DATABASES``.
    """
    return _configured(using or tenancy_settings.WORKER_DATABASE,
                       "consumers and relays keep their offsets through a connection as the "
                       'worker role (TENANCY["WORKER_DATABASE"])')


def system_alias(using: str | None = None) -> str:
    """The alias of the system role, which sees every tenant's rows of the library's tables.

    Raises:
        ConfigurationError: the alias is not in ``DATABASES``.
    """
    return _configured(using or tenancy_settings.SYSTEM_DATABASE,
                       "cross-tenant work (reaping, relaying, reading the outbox) needs a "
                       'connection as the system role (TENANCY["SYSTEM_DATABASE"])')


def admin_alias(using: str | None = None) -> str:
    """The alias the admin's lists and the metrics' gauges read every tenant's rows through.

    ``TENANCY["ADMIN_DATABASE"]``, else the system alias. Cross-tenant
    credentials in the web process widen what a bug there can reach: a role
    of its own, with ``BYPASSRLS`` and ``SELECT`` only, narrows them.

    Raises:
        ConfigurationError: the alias is not in ``DATABASES``.
    """
    alias = using or tenancy_settings.ADMIN_DATABASE
    if alias is None:
        return system_alias()
    return _configured(alias, "the admin's lists and the metrics' gauges read through it "
                              '(TENANCY["ADMIN_DATABASE"])')


def tenant_alias(using: str | None = None) -> str:
    """Where tenant-scoped work runs now: ``using``, else the worker alias inside
    :func:`working_as_worker`, else the app alias."""
    return using or _working_on.get() or tenancy_settings.APP_DATABASE


@contextmanager
def working_as_worker(alias: str) -> Iterator[str]:
    """Send this thread's (or task's) tenant work to ``alias`` while the block runs.

    Opened by a consumer's batch around its transaction on the worker alias:
    ``tenant_context()`` without ``using``, ``publish()`` and the ORM (through
    ``AppDatabaseRouter``) then run in that transaction.
    """
    token = _working_on.set(alias)
    try:
        yield alias
    finally:
        _working_on.reset(token)
