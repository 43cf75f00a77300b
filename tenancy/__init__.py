"""Per-tenant isolation shared by the idempotency and outbox apps.

The tenant of the current transaction lives in one PostgreSQL setting,
``app.tenant_id``, set transaction-locally by :func:`tenant_context`. Every
table of the library carries a row-level security policy comparing its
``tenant_id`` column with that setting, so isolation is enforced by the
database, whatever query reaches it.
"""

from django_idempotency_outbox import __version__
from tenancy.context import GUC, current_tenant_id, tenant_context, validate_tenant_id
from tenancy.exceptions import CrossTenantRefused, TenancyError

__all__ = [
    "GUC",
    "CrossTenantRefused",
    "TenancyError",
    "__version__",
    "current_tenant_id",
    "tenant_context",
    "validate_tenant_id",
]
