"""The outbox in Django's admin: parked messages, and where every reader is.

Both lists read through ``TENANCY["ADMIN_DATABASE"]`` (by default the
system alias), the alias the idempotency admin reads keys through: the app
alias, confined by row-level security, would show nothing outside a tenant
context. Re-driving and discarding write as each message's tenant on the app
alias, under row-level security, like ``outbox_parked --redrive``; both ask
for a confirmation first. Re-driving needs the change permission on parked
messages, discarding the delete permission; nobody may add or edit a row.
The readers' positions are read-only: moving them is ``relay_outbox
--rewind-to``'s job, or an operator's with SQL (docs/consumers.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from outbox import store
from outbox.deadletters import discard, redrive
from outbox.exceptions import ConsumerConfigError
from outbox.models import ParkedMessageRecord, ReaderPositionRecord
from tenancy.aliases import admin_alias

if TYPE_CHECKING:  # ModelAdmin is generic in django-stubs, not at run time
    _ParkedAdminBase = admin.ModelAdmin[ParkedMessageRecord]
    _PositionAdminBase = admin.ModelAdmin[ReaderPositionRecord]
else:
    _ParkedAdminBase = _PositionAdminBase = admin.ModelAdmin


def _rows(queryset: QuerySet[Any]) -> list[tuple[int, int]]:
    return [(int(t), int(i)) for t, i in queryset.values_list("tenant_id", "id")]


def _confirm(
    modeladmin: ParkedMessageAdmin, request: HttpRequest, queryset: QuerySet[Any],
    action: str, verb: str, warning: str,
) -> TemplateResponse:
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": f"{verb.capitalize()} {queryset.count()} parked message(s)?",
        "opts": modeladmin.model._meta,
        "rows": list(queryset),
        "action": action,
        "verb": verb,
        "warning": warning,
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        "select_across": request.POST.get("select_across", "0"),
    }
    return TemplateResponse(request, "admin/outbox/confirm_parked.html", context)


@admin.action(description="Re-drive the selected parked messages", permissions=["change"])
def redrive_selected(
    modeladmin: ParkedMessageAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> HttpResponse | None:
    if request.POST.get("confirmed") != "yes":
        return _confirm(
            modeladmin, request, queryset, "redrive_selected", "re-drive",
            "Each message is handled again by its consumer (or Celery receiver), as its "
            "tenant, and deleted once the handler succeeds. A message that fails again "
            "stays parked with one more attempt counted.",
        )
    try:
        result = redrive(ids=_rows(queryset))
    except ConsumerConfigError as exc:
        modeladmin.message_user(request, f"Nothing re-driven past this: {exc}", messages.ERROR)
        return None
    level = messages.WARNING if result.failed else messages.SUCCESS
    modeladmin.message_user(
        request,
        f"Re-driven: {result.handled} handled, {result.failed} failed again, "
        f"{result.missing} no longer parked (or being re-driven elsewhere).",
        level,
    )
    return None


@admin.action(description="Discard the selected parked messages", permissions=["delete"])
def discard_selected(
    modeladmin: ParkedMessageAdmin, request: HttpRequest, queryset: QuerySet[Any]
) -> HttpResponse | None:
    if request.POST.get("confirmed") != "yes":
        return _confirm(
            modeladmin, request, queryset, "discard_selected", "discard",
            "The messages are deleted from the dead-letter table without being handled: "
            "their effects will never happen. This cannot be undone.",
        )
    deleted = discard(_rows(queryset))
    modeladmin.message_user(request, f"Discarded {deleted} parked message(s).", messages.SUCCESS)
    return None


@admin.register(ParkedMessageRecord)
class ParkedMessageAdmin(_ParkedAdminBase):
    list_display = [
        "tenant_id", "id", "consumer", "topic", "key", "message_id", "attempts",
        "parked_at", "last_error",
    ]
    list_filter = ["consumer", "topic", "tenant_id"]
    search_fields = ["message_id", "key", "topic"]
    list_display_links = None  # no page per row: the admin acts on selections only
    actions = [redrive_selected, discard_selected]
    show_full_result_count = False

    @admin.display(description="last error")
    def last_error(self, obj: ParkedMessageRecord) -> str:
        return (obj.error.strip().splitlines() or [""])[-1][:120]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(admin_alias())

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # would delete through the admin alias, unasked
        return actions

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> None:
        return None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(ReaderPositionRecord)
class ReaderPositionAdmin(_PositionAdminBase):
    list_display = [
        "name", "partition_label", "last_id", "held_back", "behind", "lag",
        "last_processed_at", "attempts", "lease",
    ]
    list_display_links = None
    actions = None
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(admin_alias())

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        alias = admin_alias()
        # One query for the page's lag columns, read when the page is.
        self._states = {(r.name, r.partition): r for r in store.reader_states(alias)}
        return super().changelist_view(request, extra_context)

    def _row(self, obj: ReaderPositionRecord) -> store.ReaderState | None:
        return getattr(self, "_states", {}).get((obj.name, obj.partition))

    @admin.display(description="partition")
    def partition_label(self, obj: ReaderPositionRecord) -> str:
        return f"{obj.partition}/{obj.partition_count}"

    @admin.display(description="tenants held back")
    def held_back(self, obj: ReaderPositionRecord) -> str:
        held = obj.held or {}
        return ", ".join(f"{tenant} at {upto}" for tenant, upto in sorted(
            held.items(), key=lambda item: int(item[0])))

    @admin.display(description="behind (messages)")
    def behind(self, obj: ReaderPositionRecord) -> int | str:
        row = self._row(obj)
        return row.behind if row else "-"

    @admin.display(description="lag (seconds)")
    def lag(self, obj: ReaderPositionRecord) -> str:
        row = self._row(obj)
        if row is None:
            return "-"
        return f"{row.lag.total_seconds():.1f}" if row.lag else "0"

    @admin.display(description="relay lease")
    def lease(self, obj: ReaderPositionRecord) -> str:
        row = self._row(obj)
        if row is None or not row.is_relay:
            return ""
        if row.lease_left is None:
            return "none held"
        if row.lease_left < 0:
            return f"ran out {-row.lease_left:.0f} s ago ({row.lease_owner})"
        return f"{row.lease_owner}, {row.lease_left:.1f} s left"

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> None:
        return None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
