"""A read-only admin list of idempotency keys, across tenants.

Rows are read through ``TENANCY["ADMIN_DATABASE"]`` (by default the system
alias): the app alias, confined by row-level security, would show no rows
outside a tenant context. Giving the web process cross-tenant credentials is
a real widening of what a bug in it could reach, so prefer a role of its own
for this alias (BYPASSRLS, SELECT on ``idempotency_keys`` only), or serve the
admin from a separate deployment. Staff with the view permission see every
tenant's keys: grant it accordingly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest

from idempotency import store
from idempotency.conf import STUCK_AFTER
from idempotency.models import IdempotencyKeyRecord
from tenancy.aliases import admin_alias

if TYPE_CHECKING:  # ModelAdmin is generic in django-stubs, not at run time
    _KeyAdminBase = admin.ModelAdmin[IdempotencyKeyRecord]
else:
    _KeyAdminBase = admin.ModelAdmin


def stuck_condition() -> Q:
    """Pending, nothing working on it (no live lease), claimed more than an hour ago."""
    return store.stuck(STUCK_AFTER)


class StuckFilter(admin.SimpleListFilter):
    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Stuck unfinished"), ("no", "Not stuck")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() == "yes":
            return queryset.filter(stuck_condition())
        if self.value() == "no":
            return queryset.exclude(stuck_condition())
        return None


class ExpiredFilter(admin.SimpleListFilter):
    title = "expired"
    parameter_name = "expired"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Expired"), ("no", "Live")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() == "yes":
            return queryset.filter(expires_at__lte=Now())
        if self.value() == "no":
            return queryset.filter(expires_at__gt=Now())
        return None


@admin.register(IdempotencyKeyRecord)
class IdempotencyKeyAdmin(_KeyAdminBase):
    list_display = [
        "tenant_id", "scope", "key", "state", "status_code", "recovery_point",
        "request_method", "request_path", "created_at", "expires_at", "locked_until",
    ]
    list_filter = ["state", StuckFilter, ExpiredFilter, "scope"]
    search_fields = ["key", "scope", "request_path"]
    list_display_links = None  # no page per row: key alone does not identify one
    actions = None
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(admin_alias())

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> None:
        return None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
