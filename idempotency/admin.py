"""Idempotency keys in Django's admin: a read-only list across tenants, and each key's page.

Rows are read through ``TENANCY["ADMIN_DATABASE"]`` (the system alias by
default; :class:`tenancy.admin.CrossTenantAdmin`), confined to
``TENANCY["ADMIN_TENANTS"]`` when set. The list stays cheap on millions of
keys: the tenant and scope are typed in, not listed; each filter's counts are
one pass; the row count stops at 10,000 (docs/operations.md).
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, QuerySet
from django.db.models.functions import Now
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from idempotency import store
from idempotency.conf import STUCK_AFTER
from idempotency.models import IdempotencyKey, IdempotencyKeyRecord
from tenancy.admin import CrossTenantAdmin, TenantFilter, admin_tenants, seconds, to_the_second
from tenancy.aliases import admin_alias


class ConditionFilter(admin.SimpleListFilter):
    """A filter whose choices are conditions on the row itself.

    Its "show counts" are ``count(*) FILTER (WHERE condition)`` in the one
    query Django makes for the filter's counts, not Django's default
    ``pk IN (subquery)``, which this table's ``key`` (not unique alone) makes
    both wrong and quadratic.
    """

    conditions: dict[str, tuple[str, Q]] = {}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, label) for value, (label, _) in self.conditions.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        chosen = self.conditions.get(self.value() or "")
        return None if chosen is None else queryset.filter(chosen[1])

    def get_facet_counts(self, pk_attname: str, filtered_qs: QuerySet[Any]) -> dict[str, Any]:
        return {f"{i}__c": Count(pk_attname, filter=condition)
                for i, (_, condition) in enumerate(self.conditions.values())}


def stuck_condition() -> Q:
    """Pending, nothing working on it (no live lease), claimed more than an hour ago."""
    return store.stuck(STUCK_AFTER)


class StuckFilter(ConditionFilter):
    title = "stuck"
    parameter_name = "stuck"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.conditions = {
            "yes": ("Stuck unfinished", stuck_condition()),
            "no": ("Not stuck", ~stuck_condition()),
        }
        super().__init__(*args, **kwargs)


class ExpiredFilter(ConditionFilter):
    title = "expired"
    parameter_name = "expired"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.conditions = {
            "yes": ("Expired", Q(expires_at__lte=Now())),
            "no": ("Live", Q(expires_at__gt=Now())),
        }
        super().__init__(*args, **kwargs)


class ScopeFilter(TenantFilter):
    """A scope typed in (listing the distinct scopes would scan the table)."""

    title = "scope"
    parameter_name = "scope"
    placeholder = "scope, e.g. order.create"

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        return queryset.filter(scope=self.value()) if self.value() else None


def _body(raw: bytes | memoryview | None, headers: list[list[str]]) -> str:
    """The stored body as a person reads it: JSON indented, text as is, bytes counted."""
    if raw is None:
        return "(none)"
    data = bytes(raw)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"({len(data)} bytes, not UTF-8 text)"
    kind = next((v for k, v in headers if k.lower() == "content-type"), "")
    if "json" in kind:
        try:
            return json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False)
        except ValueError:
            pass
    return text


@admin.register(IdempotencyKeyRecord)
class IdempotencyKeyAdmin(CrossTenantAdmin):
    list_display = [
        "page", "tenant_id", "scope", "state", "status_code", "recovery_point",
        "request_method", "request_path", to_the_second("created_at", "created at"),
        to_the_second("expires_at", "expires at"), to_the_second("locked_until", "locked until"),
    ]
    list_filter = ["state", StuckFilter, ExpiredFilter, TenantFilter, ScopeFilter]
    search_fields = ["key", "request_path"]
    actions = None
    #: The primary key's order: a page is an index read at any size (Django's default,
    #: ``-key``, sorts the whole table).
    ordering = ["tenant_id", "scope", "key"]

    @admin.display(description="key", ordering="key")
    def page(self, obj: IdempotencyKeyRecord) -> str:
        query = urlencode({"tenant_id": str(obj.tenant_id), "scope": obj.scope, "key": obj.key})
        url = reverse("admin:idempotency_idempotencykeyrecord_page") + "?" + query
        return format_html('<a href="{}">{}</a>', url, obj.key)

    def get_urls(self) -> list[URLPattern]:
        page = self.admin_site.admin_view(self.page_view)
        return [path("key/", page, name="idempotency_idempotencykeyrecord_page"),
                *super().get_urls()]

    def page_view(self, request: HttpRequest) -> HttpResponse:
        """One key, named by ``?tenant_id=&scope=&key=``: its request and its stored answer."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            tenant = int(request.GET.get("tenant_id", ""))
        except ValueError:
            raise Http404("tenant_id is not a number") from None
        allowed = admin_tenants(request)
        keys = IdempotencyKey.objects.using(admin_alias())
        row = None if allowed is not None and tenant not in allowed else keys.filter(
            tenant_id=tenant, scope=request.GET.get("scope", ""), key=request.GET.get("key", ""),
        ).first()
        if row is None:
            raise Http404("no such key (expired and reaped?)")
        headers = [list(h) for h in (row.response_headers or [])]
        context = {
            **self.admin_site.each_context(request),
            "title": f"Idempotency key {row.key!r}",
            "opts": self.opts,
            "row": row,
            "times": [(label, seconds(getattr(row, name))) for label, name in (
                ("created at", "created_at"), ("completed at", "completed_at"),
                ("updated at", "updated_at"), ("expires at", "expires_at"),
                ("locked until", "locked_until"))],
            "headers": headers,
            "body": _body(row.response, headers),
            "phase_state": json.dumps(row.phase_state, indent=2, sort_keys=True)
            if row.phase_state is not None else None,
            "request_data": json.dumps(row.request_data, indent=2, sort_keys=True)
            if row.request_data is not None else None,
        }
        return TemplateResponse(request, "admin/idempotency/key.html", context)
