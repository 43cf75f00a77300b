"""What the library's admin pages share: one read-only base, and who may see which tenant.

The library's tables are under row-level security, so its admin pages read
them through ``TENANCY["ADMIN_DATABASE"]`` (by default the system alias),
across tenants. :class:`CrossTenantAdmin` is that list: read through the
admin alias, confined to the tenants :func:`admin_tenants` allows, nothing
added, edited or deleted through Django's own forms (the apps' pages and
actions that change rows do so as each row's tenant, on the app alias), and
a row count that stops at :attr:`CappedPaginator.cap` so that a page of a
table of ten million rows never counts them all.

Confining staff to tenants (``TENANCY["ADMIN_TENANTS"]``) is done by the
admin's querysets: every list, page, action and background job of the
library's admin filters on the tenants the callable returns. It is the
admin's rule, not the database's: the admin alias's role still sees every
tenant, so a staff user who may run SQL (or a bug in an admin page of your
own on that alias) is not confined by it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.paginator import Paginator
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.module_loading import import_string

from tenancy.aliases import admin_alias
from tenancy.conf import tenancy_settings

if TYPE_CHECKING:  # ModelAdmin is generic in django-stubs, not at run time
    _Base = admin.ModelAdmin[Any]
else:
    _Base = admin.ModelAdmin


def admin_tenants(request: HttpRequest) -> frozenset[int] | None:
    """The tenants ``request.user`` may see in the library's admin (None: every tenant).

    ``TENANCY["ADMIN_TENANTS"]``'s answer for the request, e.g.::

        def tenants_of_staff(request):
            if request.user.is_superuser:
                return None                       # every tenant
            return request.user.merchants.values_list("merchant_id", flat=True)

        TENANCY = {..., "ADMIN_TENANTS": "shop.admin.tenants_of_staff"}

    An empty answer shows nothing.
    """
    hook = tenancy_settings.ADMIN_TENANTS
    if hook is None:
        return None
    if isinstance(hook, str):
        hook = import_string(hook)
    allowed = hook(request)
    return None if allowed is None else frozenset(int(t) for t in allowed)


def seconds(value: datetime | None) -> str:
    """A time to the second, in the current time zone (the admin's own format stops at minutes)."""
    if value is None:
        return "-"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")


def to_the_second(field: str, description: str | None = None) -> Callable[[Any], str]:
    """A ``list_display`` column showing ``field`` to the second, sortable by it."""

    @admin.display(description=description or field.replace("_", " "), ordering=field)
    def column(obj: Any) -> str:
        return seconds(getattr(obj, field))

    column.__name__ = field
    return column


class CappedPaginator(Paginator):  # type: ignore[type-arg]
    """Counts at most ``cap`` rows (then says ``cap + 1``).

    Django's changelist counts the filtered rows on every page view; on a table
    of millions of rows that is a scan each time. Unordered and limited, the
    count stops early.
    """

    cap = 10_000

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if isinstance(rows, QuerySet):
            return rows.order_by()[: self.cap + 1].count()
        return len(rows)


class TenantFilter(admin.SimpleListFilter):
    """A tenant id typed in (no list of every tenant: that list would scan the table)."""

    title = "tenant"
    parameter_name = "tenant_id"
    template = "admin/tenancy/input_filter.html"
    placeholder = "tenant id"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return []

    def has_output(self) -> bool:
        return True

    def choices(self, changelist: Any) -> Iterator[Any]:
        others = [
            (name, value)
            for name, values in sorted(changelist.get_filters_params().items())
            if name != self.parameter_name
            for value in (values if isinstance(values, list) else [values])
        ]
        yield {
            "parameter_name": self.parameter_name,
            "value": self.value() or "",
            "placeholder": self.placeholder,
            "others": others,
        }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if not value:
            return None
        try:
            tenant = int(value)
        except ValueError:
            raise IncorrectLookupParameters(f"tenant id {value!r} is not a number") from None
        return queryset.filter(tenant_id=tenant)


class CrossTenantAdmin(_Base):
    """A read-only admin list of one of the library's tables, across tenants.

    Rows come through the admin alias, of the tenants :func:`admin_tenants`
    allows. Nobody may add, edit or delete a row through Django's forms, and
    Django's "delete selected" is not offered: a subclass that acts on rows
    does so through actions and pages of its own, which check the change or
    delete permission themselves (:meth:`may`).
    """

    list_display_links: Any = None
    show_full_result_count = False
    paginator = CappedPaginator
    #: The column holding the tenant (None: the table has no tenants).
    tenant_field: str | None = "tenant_id"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rows = super().get_queryset(request).using(admin_alias())
        allowed = admin_tenants(request)
        if allowed is not None and self.tenant_field is not None:
            rows = rows.filter(**{f"{self.tenant_field}__in": sorted(allowed)})
        return rows

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # would delete through the admin alias, unasked
        return actions

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> None:
        return None  # Django's change form has nothing to edit

    def may(self, request: HttpRequest, what: str) -> bool:
        """Whether the user holds Django's ``what`` ("change", "delete") permission on the model."""
        opts = self.opts
        return bool(request.user.has_perm(f"{opts.app_label}.{what}_{opts.model_name}"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False
