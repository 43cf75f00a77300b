"""Per-tenant isolation shared by the idempotency and outbox apps.

The tenant of the current transaction lives in one PostgreSQL setting,
``app.tenant_id``, set transaction-locally by :func:`tenant_context`. Every
table of the library carries a row-level security policy comparing its
``tenant_id`` column with that setting, so isolation is enforced by the
database, whatever query reaches it.

Requests get their tenant from :class:`TenantScopedViewMixin` (DRF views) or
:func:`tenant_scoped` (plain Django views); :class:`AppDatabaseRouter` sends
the ORM to the alias the tenant is set on when that alias is not ``default``.
:class:`TenantForeignKey` is a foreign key between tenant-isolated models
whose constraint includes ``tenant_id``.
The view helpers are imported on first use, so importing ``tenancy`` does not
import DRF. :func:`databases` writes the ``DATABASES`` of the four roles from
one URL (``settings.py`` may import it: importing ``tenancy`` reads no setting).
"""

from typing import TYPE_CHECKING

from django_idempotency_outbox import __version__
from django_idempotency_outbox.exports import lazy_exports
from tenancy.aliases import tenant_alias
from tenancy.context import GUC, current_tenant_id, tenant_context, validate_tenant_id
from tenancy.exceptions import CrossTenantRefused, TenancyError

__all__ = [
    "GUC",
    "AppDatabaseRouter",
    "CrossTenantRefused",
    "TenancyError",
    "TenantForeignKey",
    "TenantScopedViewMixin",
    "__version__",
    "current_tenant_id",
    "databases",
    "resolve_tenant",
    "tenant_alias",
    "tenant_context",
    "tenant_scoped",
    "validate_tenant_id",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "TenantScopedViewMixin": "tenancy.mixins",
        "TenantForeignKey": "tenancy.references",
        "tenant_scoped": "tenancy.decorators",
        "AppDatabaseRouter": "tenancy.routers",
        "resolve_tenant": "tenancy.resolver",
        "databases": "tenancy.layout",
    },
)

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from tenancy.decorators import tenant_scoped
    from tenancy.layout import databases
    from tenancy.mixins import TenantScopedViewMixin
    from tenancy.references import TenantForeignKey
    from tenancy.resolver import resolve_tenant
    from tenancy.routers import AppDatabaseRouter
