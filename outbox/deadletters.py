"""Parked messages: listing them, handling them again ("re-driving"), discarding them.

The dead-letter row is a full copy of the message (docs/consumers.md). A
re-drive runs the consumer's ``handle`` (or the receiver task's body, with its
de-duplication) as the message's tenant and deletes the row in the same
transaction: its database effects happen once, like any other message's, out
of order with the rest of its key.

Many at once is a job (:class:`outbox.models.ParkedJob`), asked for by
:func:`enqueue` and done by :func:`work` in batches along ``(tenant_id, id)``,
each batch's end written under a lease of the job's row: a worker that dies is
followed by one that goes on from there (redoing the batch it was in). Who did
what goes to the ``outbox`` logger and, for a user of the admin, to Django's
admin log (:func:`audit`).
"""

from __future__ import annotations

import logging
import os
import socket
import traceback
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models import F, Max, Q, QuerySet
from django.db.models.functions import Coalesce, Now
from django.utils.text import smart_split, unescape_string_literal

from outbox.consumers import Consumer, configured_consumers
from outbox.exceptions import ConsumerConfigError
from outbox.models import DeadLetter, ParkedJob, ParkedMessageRecord
from outbox.stream import Message
from tenancy import tenant_context
from tenancy.aliases import app_alias, system_alias

logger = logging.getLogger("outbox")

#: Rows a job handles between two writes of its progress.
JOB_BATCH = 200
#: How long a job's worker holds it without writing progress before another may take over.
JOB_LEASE = timedelta(seconds=120)

Row = tuple[int, int]  # (tenant_id, id) of a dead-letter row


@dataclass(frozen=True)
class Parked:
    """A dead-letter row, as listed for people."""

    tenant_id: int
    id: int
    consumer: str
    message_id: str
    topic: str
    key: str | None
    attempts: int
    parked_at: datetime
    error: str


def list_parked(
    consumer: str | None = None, tenant_id: int | None = None, limit: int = 100
) -> list[Parked]:
    """Parked messages across tenants (read on the system alias), oldest first."""
    rows = DeadLetter.objects.using(system_alias()).order_by("parked_at", "tenant_id", "id")
    if consumer is not None:
        rows = rows.filter(consumer=consumer)
    if tenant_id is not None:
        rows = rows.filter(tenant_id=tenant_id)
    return [Parked(r.tenant_id, r.id, r.consumer, str(r.message_id), r.topic, r.key, r.attempts,
                   r.parked_at, r.error) for r in rows.defer("payload", "headers")[:limit]]


@dataclass(frozen=True)
class RedriveResult:
    handled: int
    failed: int
    missing: int


def redrive(
    consumer: str | None = None,
    ids: Sequence[Row] | None = None,
    *,
    tenant_id: int | None = None,
    by: str = "",
) -> RedriveResult:
    """Handle parked messages again; delete each one whose handler succeeds.

    Args:
        consumer: only this consumer's parked messages.
        ids: only these ``(tenant_id, id)`` dead-letter rows.
        tenant_id: only this tenant's.
        by: who asked (for the log line).

    Each message is its own transaction on the app alias, as its tenant. A
    handler that fails again leaves the row parked, with the attempt counted,
    the new error and the time of the failure (``redrive_failed_at``; its
    ``parked_at`` stays). A row being re-driven by someone else is skipped.

    Raises:
        ConsumerConfigError: a row names a consumer that is not configured.
    """
    consumers = {c.name: c for c in configured_consumers()}
    if consumer is not None and consumer not in consumers and not _is_receiver(consumer):
        raise ConsumerConfigError(f"unknown consumer {consumer!r}")
    if ids is None:
        rows = [(p.tenant_id, p.id) for p in list_parked(consumer, tenant_id, limit=10**9)]
    else:
        rows = list(ids)
    outcomes: dict[str, list[Row]] = {"handled": [], "failed": [], "missing": []}
    try:
        for tenant, row_id in rows:
            outcomes[_redrive_one(consumers, tenant, row_id, consumer)].append((tenant, row_id))
    finally:
        if rows:
            logger.warning(
                "outbox: %s re-drove %d parked message(s): %d handled (%s), %d failed again "
                "(%s), %d no longer parked", by or _process(), len(rows),
                len(outcomes["handled"]), spans(outcomes["handled"]), len(outcomes["failed"]),
                spans(outcomes["failed"]), len(outcomes["missing"]))
    return RedriveResult(*(len(outcomes[k]) for k in ("handled", "failed", "missing")))


def _redrive_one(
    consumers: dict[str, Consumer], tenant: int, row_id: int, only: str | None
) -> str:
    alias = app_alias()
    with tenant_context(tenant, using=alias):
        mine = DeadLetter.objects.using(alias).filter(tenant_id=tenant, id=row_id)
        row = mine.select_for_update(skip_locked=True).first()  # skipped: someone re-drives it
        if row is None or (only is not None and row.consumer != only):
            return "missing"
        name = row.consumer
        handle = _receiver_handler(name, tenant, row_id) if _is_receiver(name) else None
        if handle is None and name not in consumers:
            raise ConsumerConfigError(
                f"parked message {tenant}/{row_id} belongs to consumer {name!r}, which is not "
                'in OUTBOX["CONSUMERS"]'
            )
        message = Message(
            id=row.message_pk, message_id=row.message_id, tenant_id=tenant, topic=row.topic,
            payload=row.payload, key=row.key, aggregate_type=row.aggregate_type,
            aggregate_id=row.aggregate_id, headers=row.headers or {},
            created_at=row.message_created_at)
        try:
            with transaction.atomic(using=alias):
                (handle or consumers[name].handle)(message)
        except Exception as exc:
            logger.warning("outbox: re-driving %s/%s for %s failed again: %s",
                           tenant, row_id, name, exc)
            error = "".join(traceback.format_exception(exc)).strip()
            mine.update(attempts=F("attempts") + 1, error=error, redrive_failed_at=Now())
            return "failed"
        mine.delete()
        return "handled"


def _is_receiver(name: str) -> bool:
    return name.startswith(("celery:", "tasks:"))


def _receiver_handler(name: str, tenant: int, row_id: int) -> Callable[[Message], object]:
    """Runs the receiver task's body on a parked message, in this process."""
    if name.startswith("tasks:"):  # a receiver on Django's Tasks framework
        from outbox.django_tasks import redrive_handler

        handle = redrive_handler(name)
        if handle is None:
            raise ConsumerConfigError(
                f"parked message {tenant}/{row_id} belongs to {name!r}, which does not name a "
                "Django task made by outbox.django_tasks.receiver_task")
        return handle
    from outbox.celery import DEAD_LETTER_PREFIX, receiver_body

    task_name = name.removeprefix(DEAD_LETTER_PREFIX)
    body = receiver_body(task_name)
    if body is None:
        raise ConsumerConfigError(
            f"parked message {tenant}/{row_id} belongs to Celery task {task_name!r}, which the "
            'Celery app (OUTBOX["CELERY_APP"]) does not have as an outbox receiver'
        )
    # The Message itself, not its envelope: it comes from the dead-letter
    # table, where only a message that passed its receiver's checks is parked.
    return body


def discard(ids: Sequence[Row], *, by: str = "") -> int:
    """Delete dead-letter rows ``(tenant_id, id)`` without handling them; return how many.

    Each tenant's rows are deleted as that tenant, on the app alias (under
    row-level security), in one transaction per tenant.
    """
    alias = app_alias()
    by_tenant: dict[int, list[int]] = {}
    for tenant, row_id in ids:
        by_tenant.setdefault(tenant, []).append(row_id)
    gone: list[Row] = []
    for tenant, rows in sorted(by_tenant.items()):
        with tenant_context(tenant, using=alias):
            mine = DeadLetter.objects.using(alias).filter(tenant_id=tenant, id__in=rows)
            found = list(mine.values_list("tenant_id", "id"))
            mine.delete()
            gone.extend(found)
    if gone:
        logger.warning("outbox: %s discarded %d parked message(s) unhandled: %s",
                       by or _process(), len(gone), spans(gone))
    return len(gone)


def search_terms(search: str) -> Q:
    """What the admin's search box matches: each term (quotes keep words together) in the
    key, topic, consumer or error (the traceback), or equal to the message id."""
    match = Q()
    for bit in smart_split(search):
        if bit[:1] in "\"'" and bit[-1:] == bit[:1]:
            bit = unescape_string_literal(bit)
        term = Q(key__icontains=bit) | Q(topic__icontains=bit) | Q(consumer__icontains=bit)
        term |= Q(error__icontains=bit)
        try:
            term |= Q(message_id=uuid.UUID(bit))
        except ValueError:
            pass
        match &= term
    return match


def matching(job: ParkedJob, using: str | None = None) -> QuerySet[DeadLetter]:
    """The dead-letter rows a job covers (on the system alias unless ``using``)."""
    rows = DeadLetter.objects.using(system_alias(using)).filter(id__lte=job.upto_id)
    if job.consumer is not None:
        rows = rows.filter(consumer=job.consumer)
    if job.topic is not None:
        rows = rows.filter(topic=job.topic)
    if job.tenants is not None:
        rows = rows.filter(tenant_id__in=job.tenants)
    if job.search:
        rows = rows.filter(search_terms(job.search))
    if job.rows is not None:
        rows = rows.filter(pk__in=[tuple(r) for r in job.rows])
    return rows


def enqueue(
    action: str,
    *,
    consumer: str | None = None,
    topic: str | None = None,
    tenants: Iterable[int] | None = None,
    search: str = "",
    rows: Sequence[Row] | None = None,
    requested_by: str,
    user_id: int | None = None,
) -> ParkedJob:
    """Ask for every parked message the filter matches now to be re-driven or discarded.

    Args:
        action: ``"redrive"`` or ``"discard"``.
        consumer, topic, tenants, search: the filter (None, or empty: any);
            ``search`` as :func:`search_terms`.
        rows: only these ``(tenant_id, id)`` rows (a selection in the admin).
        requested_by: who asked, for the log lines.
        user_id: the admin's user who asked: the job's end is written to
            Django's admin log as theirs.

    Messages parked after this call are left alone (the job covers ids up to
    the highest one now). Written on the system alias, in its own
    transaction; nothing is re-driven here.
    """
    if action not in ParkedJob.Action.values:
        raise ValueError(f"unknown action {action!r}; expected one of {ParkedJob.Action.values}")
    alias = system_alias()
    top = DeadLetter.objects.using(alias).aggregate(top=Max("id"))["top"] or 0
    job = ParkedJob(
        action=action, consumer=consumer or None, topic=topic or None,
        tenants=None if tenants is None else sorted({int(t) for t in tenants}),
        search=search.strip(), rows=None if rows is None else [list(r) for r in rows],
        upto_id=top, requested_by=requested_by, user_id=user_id,
    )
    job.total = matching(job).count()
    job.save(using=alias)
    logger.warning("outbox: %s asked to %s %d parked message(s) (%s) as job %d",
                   requested_by, job.get_action_display(), job.total, describe(job), job.pk)
    return job


def describe(job: ParkedJob) -> str:
    """The job's filter, in words."""
    parts = []
    if job.rows is not None:
        parts.append(f"the rows {spans([(int(t), int(i)) for t, i in job.rows])}")
    for label, value in (("consumer", job.consumer), ("topic", job.topic)):
        if value is not None:
            parts.append(f"{label} {value}")
    if job.tenants is not None:
        parts.append(f"tenant(s) {', '.join(str(t) for t in job.tenants)}")
    if job.search:
        parts.append(f"matching {job.search!r}")
    parts.append(f"parked as id {job.upto_id} or before")
    return ", ".join(parts)


def work(
    *, batch_size: int = JOB_BATCH, owner: str | None = None,
    progress: Callable[[ParkedJob], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> list[ParkedJob]:
    """Work every job that is queued, or whose worker stopped writing, to its end.

    Args:
        batch_size: rows between two writes of a job's progress.
        owner: this worker's name in the jobs' lease (default host:pid:random).
        progress: called with the job after each batch.
        stop: asked between batches; once true, the job in hand is left where
            it got to, its lease let go (the next worker goes on at once).

    Returns the jobs this call finished (or failed), in order. A job that
    another worker holds is left to it; two workers never share one.
    """
    owner = owner or f"{_process()}:{uuid.uuid4().hex[:8]}"
    finished = []
    while not stop() and (job := _claim(owner)) is not None:
        if _run(job, owner, batch_size, progress, stop):
            finished.append(job)
    return finished


def _lease_free() -> Q:
    return Q(lease_until__isnull=True) | Q(lease_until__lt=Now())


def _claim(owner: str) -> ParkedJob | None:
    alias = system_alias()
    jobs = ParkedJob.objects.using(alias)
    open_jobs = jobs.filter(state__in=[ParkedJob.State.QUEUED, ParkedJob.State.RUNNING])
    for job_id in open_jobs.filter(_lease_free()).order_by("id").values_list("id", flat=True)[:5]:
        taken = jobs.filter(_lease_free(), pk=job_id, state__in=[
            ParkedJob.State.QUEUED, ParkedJob.State.RUNNING,
        ]).update(lease_owner=owner, lease_until=Now() + JOB_LEASE,
                  state=ParkedJob.State.RUNNING, started_at=Coalesce("started_at", Now()))
        if taken:
            return jobs.get(pk=job_id)
    return None


def _run(job: ParkedJob, owner: str, batch_size: int,
         progress: Callable[[ParkedJob], None] | None, stop: Callable[[], bool]) -> bool:
    """Work ``job`` until it ends (True), or ``stop`` says so or its lease is lost (False)."""
    jobs = ParkedJob.objects.using(system_alias()).filter(pk=job.pk, lease_owner=owner)
    while True:
        if stop():
            jobs.update(lease_owner="", lease_until=None)
            return False
        batch = [
            (int(t), int(i)) for t, i in matching(job)
            .filter(pk__gt=(job.after_tenant_id, job.after_id))
            .order_by("tenant_id", "id").values_list("tenant_id", "id")[:batch_size]
        ]
        if not batch:
            break
        by = f"{job.requested_by} (job {job.pk})"
        try:
            if job.action == ParkedJob.Action.REDRIVE:
                result = redrive(ids=batch, by=by)
                counts = (result.handled, result.failed, result.missing)
            else:
                gone = discard(batch, by=by)
                counts = (gone, 0, len(batch) - gone)
        except ConsumerConfigError as exc:
            return _finish(job, jobs, ParkedJob.State.FAILED, str(exc))
        job.after_tenant_id, job.after_id = batch[-1]
        if not jobs.update(after_tenant_id=job.after_tenant_id, after_id=job.after_id,
                           handled=F("handled") + counts[0], failed=F("failed") + counts[1],
                           missing=F("missing") + counts[2], lease_until=Now() + JOB_LEASE):
            logger.warning("outbox: job %d was taken over by another worker; %s stops", job.pk,
                           owner)
            return False
        job.refresh_from_db(using=system_alias())
        if progress is not None:
            progress(job)
    return _finish(job, jobs, ParkedJob.State.DONE)


def _finish(job: ParkedJob, jobs: QuerySet[ParkedJob], state: str, error: str = "") -> bool:
    jobs.update(state=state, finished_at=Now(), last_error=error, lease_owner="",
                lease_until=None)
    job.refresh_from_db(using=system_alias())
    verb = "re-drove" if job.action == ParkedJob.Action.REDRIVE else "discarded"
    outcome = (f"{job.handled} handled, {job.failed} failed again, {job.missing} no longer parked"
               if job.action == ParkedJob.Action.REDRIVE
               else f"{job.handled} discarded, {job.missing} no longer parked")
    text = (f"job {job.pk} {verb} the parked messages of {describe(job)}: {outcome}"
            if job.state == ParkedJob.State.DONE
            else f"job {job.pk} stopped: {job.last_error} ({outcome} before)")
    logger.warning("outbox: %s for %s", text, job.requested_by)
    if job.user_id is not None:
        audit(job.user_id, ParkedJob, str(job.pk), str(job), CHANGE, text)
    return True


def audit(user_id: int, model: type[ParkedJob] | type[ParkedMessageRecord], object_id: str,
          object_repr: str, flag: int, message: str) -> None:
    """One entry of Django's admin log (its "Recent actions" and history pages) as ``user_id``.

    Nothing is written for a user who no longer exists.
    """
    if not get_user_model().objects.filter(pk=user_id).exists():
        return
    LogEntry.objects.create(
        user_id=user_id, content_type=ContentType.objects.get_for_model(model),
        object_id=object_id, object_repr=object_repr[:200], action_flag=flag,
        change_message=message,
    )


def spans(rows: Iterable[Row]) -> str:
    """``(tenant, id)`` rows in few words: ``1/5-9, 1/12, 2/40``."""
    runs: list[list[int]] = []  # [tenant, first id, last id]
    for tenant, row_id in sorted(rows):
        if runs and runs[-1][0] == tenant and runs[-1][2] == row_id - 1:
            runs[-1][2] = row_id
        else:
            runs.append([tenant, row_id, row_id])
    return ", ".join(f"{t}/{a}" + (f"-{b}" if b != a else "") for t, a, b in runs) or "none"


def _process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
