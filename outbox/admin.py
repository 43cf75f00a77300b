"""The outbox in Django's admin: parked messages, the jobs that re-drive them, the readers.

Read through ``TENANCY["ADMIN_DATABASE"]`` (:class:`tenancy.admin.CrossTenantAdmin`),
of the tenants the user may see. A parked message's page re-drives or discards
it at once, as its tenant; a selection, or everything a filter matches, becomes
a job (:mod:`outbox.deadletters`) after a confirmation. Re-driving needs the
change permission, discarding the delete permission; each goes to Django's
admin log. The readers' positions are read-only: ``relay_outbox --rewind-to`` or SQL
moves them (docs/operations.md, "The outbox in the admin").
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from outbox import store
from outbox.conf import outbox_settings
from outbox.deadletters import audit, describe, discard, enqueue, redrive, search_terms
from outbox.exceptions import ConsumerConfigError
from outbox.models import ParkedJob, ParkedMessageRecord, ReaderPositionRecord
from tenancy.admin import CrossTenantAdmin, TenantFilter, admin_tenants, seconds, to_the_second
from tenancy.aliases import admin_alias

#: Rows shown on a confirmation page (the rest are counted).
SAMPLE = 20


def _user(request: HttpRequest) -> str:
    return f"{request.user.get_username()} (admin)"


def _audit(request: HttpRequest, *args: Any) -> None:
    """Django's admin log, as the request's user."""
    audit(int(str(request.user.pk)), *args)


def _filter_of(request: HttpRequest) -> dict[str, Any]:
    """The parked messages' list filter, from its query string, for a job."""
    tenants = admin_tenants(request)
    chosen = request.GET.get("tenant_id")
    if chosen:
        wanted = frozenset([int(chosen)])
        tenants = wanted if tenants is None else wanted & tenants
    return {
        "consumer": request.GET.get("consumer") or None,
        "topic": request.GET.get("topic") or None,
        "tenants": tenants,
        "search": request.GET.get("q", ""),
    }


def _ask_for_job(
    modeladmin: ParkedMessageAdmin, request: HttpRequest, queryset: QuerySet[Any], action: str,
) -> HttpResponse | None:
    everything = request.POST.get("select_across") == "1"
    verb = ParkedJob.Action(action).label
    if request.POST.get("confirmed") != "yes":
        count = queryset.count()
        context = {
            **modeladmin.admin_site.each_context(request),
            "title": f"{verb.capitalize()} {count} parked message(s)?",
            "opts": modeladmin.model._meta,
            "rows": list(queryset[:SAMPLE]),
            "more": max(0, count - SAMPLE),
            # Django finds the action by its selected rows: a sample stands for "all".
            "selected": [str(pk) for pk in (queryset[:SAMPLE] if everything else queryset)
                         .values_list("pk", flat=True)],
            "everything": everything,
            "action": f"{action}_selected",
            "verb": verb,
            "warning": WARNINGS[action],
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/outbox/confirm_parked.html", context)
    if everything:
        job = enqueue(action, **_filter_of(request), requested_by=_user(request),
                      user_id=request.user.pk)
    else:
        rows = [(int(t), int(i)) for t, i in queryset.values_list("tenant_id", "id")]
        job = enqueue(action, rows=rows, tenants=admin_tenants(request),
                      requested_by=_user(request), user_id=request.user.pk)
    _audit(request, ParkedJob, str(job.pk), str(job), CHANGE,
          f"asked to {verb} {job.total} parked message(s) as job {job.pk}")
    modeladmin.message_user(
        request,
        f"Job {job.pk} will {verb} {job.total} parked message(s) in the background; "
        "its progress is on this page.",
        messages.SUCCESS,
    )
    return HttpResponseRedirect(reverse("admin:outbox_parkedjob_change", args=[job.pk]))


WARNINGS = {
    "redrive": (
        "Each message is handled again by its consumer (or Celery receiver), as its tenant, and "
        "deleted once the handler succeeds. A message that fails again stays parked with one "
        "more attempt counted. This runs in the background, as a job: its progress is shown on "
        "its page."
    ),
    "discard": (
        "The messages are deleted from the dead-letter table without being handled: their "
        "effects will never happen. This cannot be undone. This runs in the background, as a "
        "job: its progress is shown on its page."
    ),
}


def _job_action(action: str, permission: str) -> Any:
    """The list's action ``<action>_selected``: asks, then writes a job."""

    @admin.action(description=f"{ParkedJob.Action(action).label.capitalize()} the selected "
                  "parked messages", permissions=[permission])
    def selected(modeladmin: ParkedMessageAdmin, request: HttpRequest,
                 queryset: QuerySet[Any]) -> HttpResponse | None:
        return _ask_for_job(modeladmin, request, queryset, action)

    selected.__name__ = f"{action}_selected"
    return selected


def signature_state(consumer: str) -> str:
    """What the relay's signature meant for this message (docs/outbox.md)."""
    if not consumer.startswith(("celery:", "tasks:")):
        return "none: a consumer reads the outbox table, not the broker"
    if not outbox_settings.SIGNING_KEYS:
        return "unsigned: OUTBOX[\"SIGNING_KEYS\"] is not set"
    return ("verified by its receiver before it was parked; a re-drive runs the message as "
            "parked, without the broker")


@admin.register(ParkedMessageRecord)
class ParkedMessageAdmin(CrossTenantAdmin):
    list_display = [
        "message", "consumer", "topic", "last_error", "attempts",
        to_the_second("parked_at", "parked at"),
    ]
    list_filter = ["consumer", "topic", TenantFilter]
    search_fields = ["key"]  # the box; get_search_results searches
    search_help_text = "Key, topic, consumer, error text or message id."
    actions = [_job_action("redrive", "change"), _job_action("discard", "delete")]
    paginator = Paginator  # type: ignore[assignment]  # the dead letters are counted exactly

    @admin.display(description="tenant/id", ordering="id")
    def message(self, obj: ParkedMessageRecord) -> str:
        url = reverse("admin:outbox_parkedmessagerecord_page", args=[obj.tenant_id, obj.id])
        return format_html('<a href="{}">{}/{}</a>', url, obj.tenant_id, obj.id)

    @admin.display(description="last error")
    def last_error(self, obj: ParkedMessageRecord) -> str:
        return (obj.error.strip().splitlines() or [""])[-1][:120]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        return queryset.filter(search_terms(search_term)), False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.may(request, "change")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.may(request, "delete")

    def get_urls(self) -> list[URLPattern]:
        page = self.admin_site.admin_view(self.page_view)
        return [
            path("<int:tenant_id>/<int:row_id>/", page, name="outbox_parkedmessagerecord_page"),
            *super().get_urls(),
        ]

    def page_view(self, request: HttpRequest, tenant_id: int, row_id: int) -> HttpResponse:
        """One parked message: the whole error, the message, re-drive and discard."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        row = self.get_queryset(request).filter(tenant_id=tenant_id, id=row_id).first()
        if row is None:
            raise Http404(f"no parked message {tenant_id}/{row_id} (re-driven or discarded?)")
        object_id = f"{tenant_id}/{row_id}"
        if request.method == "POST":
            return self._act(request, row, object_id)
        history = LogEntry.objects.filter(
            content_type=ContentType.objects.get_for_model(ParkedMessageRecord),
            object_id=object_id,
        ).select_related("user").order_by("-action_time")[:20]
        context = {
            **self.admin_site.each_context(request),
            "title": f"Parked message {object_id}",
            "opts": self.opts,
            "row": row,
            "parked_at": seconds(row.parked_at),
            "published_at": seconds(row.message_created_at),
            "redrive_failed_at": seconds(row.redrive_failed_at),
            "payload": json.dumps(row.payload, indent=2, sort_keys=True, ensure_ascii=False),
            "headers": json.dumps(row.headers, indent=2, sort_keys=True, ensure_ascii=False),
            "signature": signature_state(row.consumer),
            "may_redrive": self.may(request, "change"),
            "may_discard": self.may(request, "delete"),
            "history": history,
        }
        return TemplateResponse(request, "admin/outbox/parked_message.html", context)

    def _act(self, request: HttpRequest, row: ParkedMessageRecord, object_id: str) -> HttpResponse:
        act = request.POST.get("act")
        here = reverse("admin:outbox_parkedmessagerecord_page", args=[row.tenant_id, row.id])
        back = reverse("admin:outbox_parkedmessagerecord_changelist")
        if act == "redrive" and self.may(request, "change"):
            try:
                result = redrive(ids=[(row.tenant_id, row.id)], by=_user(request))
            except ConsumerConfigError as exc:
                self.message_user(request, f"Not re-driven: {exc}", messages.ERROR)
                return HttpResponseRedirect(here)
            outcome = ("handled" if result.handled else "failed again" if result.failed
                       else "no longer parked")
            _audit(request, ParkedMessageRecord, object_id, str(row), CHANGE,
                  f"re-drove {object_id}: {outcome}")
            if result.failed:
                self.message_user(request, f"Re-driving {object_id} failed again; the new "
                                  "error is below.", messages.WARNING)
                return HttpResponseRedirect(here)
            self.message_user(request, f"Re-driven {object_id}: {outcome}.", messages.SUCCESS)
            return HttpResponseRedirect(back)
        if act == "discard" and self.may(request, "delete"):
            if request.POST.get("confirmed") != "yes":
                context = {
                    **self.admin_site.each_context(request),
                    "title": f"Discard parked message {object_id}?",
                    "opts": self.opts, "rows": [row], "more": 0, "single": True,
                    "verb": "discard", "warning": WARNINGS["discard"].split(" This runs")[0],
                }
                return TemplateResponse(request, "admin/outbox/confirm_parked.html", context)
            gone = discard([(row.tenant_id, row.id)], by=_user(request))
            _audit(request, ParkedMessageRecord, object_id, str(row), DELETION,
                  f"discarded {object_id} unhandled" if gone else
                  f"discard of {object_id}: no longer parked")
            self.message_user(request, f"Discarded {object_id}." if gone else
                              f"{object_id} was no longer parked.", messages.SUCCESS)
            return HttpResponseRedirect(back)
        raise PermissionDenied


@admin.register(ParkedJob)
class ParkedJobAdmin(CrossTenantAdmin):
    """The re-drive and discard jobs, newest first, with their progress (read-only)."""

    list_display = [
        "id", "action", "what", "requested_by", "state", "progress", "handled", "failed",
        "missing", to_the_second("created_at", "asked at"),
        to_the_second("finished_at", "finished at"), "last_error",
    ]
    list_display_links: Any = ["id"]
    list_filter = ["state", "action"]
    actions = None
    tenant_field = None

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        jobs = super().get_queryset(request)
        if admin_tenants(request) is not None:  # a confined user sees their own jobs
            jobs = jobs.filter(user_id=request.user.pk)
        return jobs

    @admin.display(description="which messages")
    def what(self, obj: ParkedJob) -> str:
        return describe(obj)

    @admin.display(description="done")
    def progress(self, obj: ParkedJob) -> str:
        done = obj.handled + obj.failed + obj.missing
        share = f" ({100 * done // obj.total}%)" if obj.total else ""
        return f"{done} of {obj.total}{share}"

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        try:
            return self.get_queryset(request).get(pk=int(object_id))
        except (ValueError, ParkedJob.DoesNotExist):
            return None

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: Any = None) -> HttpResponse:
        """A job's page: its filter, who asked, how far it has got (reloads while open)."""
        job = self.get_object(request, object_id)
        if job is None or not self.has_view_permission(request, job):
            raise Http404("no such job")
        context = {
            **self.admin_site.each_context(request),
            "title": f"Job {job.pk}: {job.get_action_display()}",
            "opts": self.opts,
            "job": job,
            "what": self.what(job),
            "progress": self.progress(job),
            "open": job.state in (ParkedJob.State.QUEUED, ParkedJob.State.RUNNING),
            "asked_at": seconds(job.created_at),
            "started_at": seconds(job.started_at),
            "finished_at": seconds(job.finished_at),
        }
        return TemplateResponse(request, "admin/outbox/parked_job.html", context)


@admin.register(ReaderPositionRecord)
class ReaderPositionAdmin(CrossTenantAdmin):
    list_display = [
        "name", "partition_label", "last_id", "held_back", "behind", "lag",
        to_the_second("last_processed_at", "last processed at"), "attempts", "lease",
    ]
    actions = None
    tenant_field = None

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        # One query for the page's lag columns, read when the page is.
        self._states = {(r.name, r.partition): r for r in store.reader_states(admin_alias())}
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
