"""Errors of the tenancy app."""

from __future__ import annotations

from django_idempotency_outbox.errors import ConfigurationError, IdempotencyOutboxError


class TenancyError(IdempotencyOutboxError):
    """Base class of the tenancy app's errors."""


class CrossTenantRefused(TenancyError, ConfigurationError):
    """Cross-tenant work was asked of a database alias that RLS confines to one tenant.

    Such a role would see one tenant's rows at most: a reaper would reap one
    tenant, a relay would skip the others' messages. The message names the
    alias, its role and the table.
    """
