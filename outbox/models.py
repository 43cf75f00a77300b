"""The outbox's tables. The statements the library sends are in ``outbox/queries.sql``;
the models are for the ORM's reads, the admin and the tests. What Django cannot express
(the trigger that gives ids and marks publishers, the ``xid8`` default, the fence's
functions, the delivery index, the row-level security policies) is in ``outbox/sql/``.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.functions import Now

from tenancy.privileges import APP, DML, SYSTEM, WORKER, TablePrivileges

#: Each role's privileges on the outbox's tables (tenancy.privileges collects them for
#: migrate's grants and tenancy.E017/E018; docs/roles.md). The app role publishes
#: (append-only), parks, re-drives and receives as its tenant, and has nothing on the
#: shared delivery state; the worker alone locks (``FOR UPDATE`` needs UPDATE), advances
#: and leases offsets; the system role reads across tenants, deletes what retention
#: deletes and keeps the re-drive jobs (which act as each tenant, on the app role). The
#: fence's key is the owner's alone. django-tasks-db's queue (every tenant's envelopes,
#: no row-level security) is the worker's alone; left out when it does not exist.
TABLE_PRIVILEGES: TablePrivileges = {
    "outbox_messages": {
        APP: ("SELECT", "INSERT"),
        WORKER: ("SELECT", "INSERT"),
        SYSTEM: ("SELECT", "DELETE"),
    },
    "consumer_offsets": {WORKER: ("SELECT", "INSERT", "UPDATE"), SYSTEM: ("SELECT",)},
    "outbox_consumer_failures": {WORKER: DML, SYSTEM: ("SELECT",)},
    "outbox_dead_letters": {APP: DML, WORKER: ("SELECT", "INSERT"), SYSTEM: ("SELECT",)},
    "outbox_received": {APP: ("SELECT", "INSERT"), SYSTEM: ("SELECT", "DELETE")},
    "outbox_parked_jobs": {SYSTEM: ("SELECT", "INSERT", "UPDATE")},
    "outbox_fence_key": {},
    "django_tasks_database_dbtaskresult": {WORKER: DML},
}


class XID8Field(models.Field):  # type: ignore[type-arg]
    """PostgreSQL's ``xid8``: a 64-bit transaction id that never wraps around."""

    description = "PostgreSQL xid8"

    def db_type(self, connection: Any) -> str:
        return "xid8"

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> int | None:
        return None if value is None else int(value)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        return None if value is None else str(int(value))


class MessageColumns(models.Model):
    """What a message says, declared once for the outbox and its dead letters."""

    topic = models.CharField(max_length=200)
    # NULL, not "": no key means no ordering promise (and partitions spread
    # such messages by message id), which an empty string would blur.
    key = models.CharField(max_length=200, null=True)  # noqa: DJ001
    aggregate_type = models.CharField(max_length=200, null=True)  # noqa: DJ001
    aggregate_id = models.CharField(max_length=200, null=True)  # noqa: DJ001
    payload = models.JSONField()
    headers = models.JSONField(default=dict)

    class Meta:
        abstract = True


class OutboxMessage(MessageColumns):
    """One event, written in the same transaction as the change it announces; append-only.

    ``id`` is given by a trigger (an insert that names one is refused), which
    first marks the transaction as a publisher in flight for the row's tenant,
    so readers never skip a message committed late (docs/guarantees.md).
    ``xid`` is the writing transaction's id, for people (it orders nothing).
    """

    tenant_isolated = True

    pk = models.CompositePrimaryKey("tenant_id", "id")
    tenant_id = models.BigIntegerField()
    id = models.BigIntegerField()
    xid = XID8Field()
    message_id = models.UUIDField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "outbox_messages"

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.id} {self.topic} ({self.message_id})"


class OffsetColumns(models.Model):
    """The columns of ``consumer_offsets`` that people read, for its two models."""

    name = models.CharField(max_length=200)
    partition = models.IntegerField(default=0)
    partition_count = models.IntegerField(default=1)
    last_id = models.BigIntegerField(default=0)
    held = models.JSONField(default=dict)
    last_processed_at = models.DateTimeField(null=True)
    attempts = models.IntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_until = models.DateTimeField(null=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.name}[{self.partition}] at {self.last_id}"


class ConsumerOffset(OffsetColumns):
    """How far one reader (a consumer partition, or a relay) has read the one stream of all
    tenants: ``last_id`` and ``held`` (:class:`outbox.stream.Position`).

    ``attempts`` and ``retry_at`` count and pace the failures of the message at
    the partition's head; what failed is tenant data, kept in
    :class:`ConsumerFailure` under row-level security. The lease is relays' only.
    """

    pk = models.CompositePrimaryKey("name", "partition")
    retry_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "consumer_offsets"


class FailureColumns(models.Model):
    """Which message of whose a consumer (or receiver) failed on, how often, and why."""

    tenant_id = models.BigIntegerField()
    consumer = models.CharField(max_length=200)
    message_pk = models.BigIntegerField()
    message_id = models.UUIDField()
    attempts = models.IntegerField()
    error = models.TextField()

    class Meta:
        abstract = True


class ConsumerFailure(FailureColumns):
    """Why a consumer partition is stuck before a message: its tenant's row, under RLS.

    Written by the consumer's batch (on the worker alias, as the message's
    tenant) when a handler raises, and deleted when the partition moves past
    the message. ``outbox_status`` reads it on the system alias.
    """

    tenant_isolated = True

    pk = models.CompositePrimaryKey("tenant_id", "consumer", "partition")
    partition = models.IntegerField()
    failed_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "outbox_consumer_failures"

    def __str__(self) -> str:
        return f"{self.consumer}[{self.partition}]: {self.tenant_id}/{self.message_pk}"


class DeadLetterColumns(MessageColumns, FailureColumns):
    """The columns of ``outbox_dead_letters``, for :class:`DeadLetter` (the table, its
    composite primary key) and :class:`ParkedMessageRecord` (the admin's view of it)."""

    message_created_at = models.DateTimeField()
    #: When it was parked: the consumer's (or receiver's) last attempt. A
    #: re-drive that fails again does not move it (see ``redrive_failed_at``).
    parked_at = models.DateTimeField(db_default=Now())
    #: When a re-drive last failed on it (None: never re-driven).
    redrive_failed_at = models.DateTimeField(null=True)

    class Meta:
        abstract = True


class DeadLetter(DeadLetterColumns):
    """A message a consumer gave up on after its ``max_attempts``, kept for people.

    A copy of the message, so the reaper may delete the original. Re-driving
    runs the consumer's handler again and deletes the row in the same
    transaction.
    """

    tenant_isolated = True

    pk = models.CompositePrimaryKey("tenant_id", "id")
    id = models.BigIntegerField()

    class Meta:
        db_table = "outbox_dead_letters"

    def __str__(self) -> str:
        return f"{self.consumer}: {self.tenant_id}/{self.message_pk} {self.topic}"


class ReceivedMessage(models.Model):
    """A message id a broker-side receiver has already handled (its de-duplication memory)."""

    tenant_isolated = True

    pk = models.CompositePrimaryKey("tenant_id", "receiver", "message_id")
    tenant_id = models.BigIntegerField()
    receiver = models.CharField(max_length=200)
    message_id = models.UUIDField()
    received_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "outbox_received"

    def __str__(self) -> str:
        return f"{self.receiver}: {self.tenant_id}/{self.message_id}"


class ParkedMessageRecord(DeadLetterColumns):
    """The dead-letter table as the admin lists it (every tenant).

    Django 5.2's admin cannot register a model with a composite primary key,
    so this unmanaged model maps ``outbox_dead_letters`` with ``id`` standing
    in as the primary key (it comes from one identity, so it does not repeat
    across tenants in practice). The admin acts on ``(tenant_id, id)`` pairs,
    never on ``id`` alone.
    """

    id = models.BigIntegerField(primary_key=True)

    class Meta:
        managed = False
        db_table = "outbox_dead_letters"
        verbose_name = "parked message"
        ordering = ["parked_at", "tenant_id", "id"]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.id} {self.consumer} {self.topic}"


class ParkedJob(models.Model):
    """A re-drive or discard of the parked messages a filter matches, done in the background
    (:mod:`outbox.deadletters`), from ``after_tenant_id``/``after_id`` on, up to ``upto_id``
    (rows parked later are left alone). Not tenant data: it names tenants, holds none of
    their rows.
    """

    class Action(models.TextChoices):
        REDRIVE = "redrive", "re-drive"
        DISCARD = "discard", "discard"

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    id = models.BigAutoField(primary_key=True)
    action = models.CharField(max_length=16, choices=Action.choices)
    # The filter: each None matches everything.
    consumer = models.CharField(max_length=200, null=True)  # noqa: DJ001
    topic = models.CharField(max_length=200, null=True)  # noqa: DJ001
    tenants = models.JSONField(null=True)  # a list of tenant ids
    search = models.CharField(max_length=200, blank=True, default="")
    rows = models.JSONField(null=True)  # a list of [tenant_id, id] pairs
    upto_id = models.BigIntegerField()
    # Who asked, for the admin log and the log lines.
    requested_by = models.CharField(max_length=200)
    user_id = models.IntegerField(null=True)
    created_at = models.DateTimeField(db_default=Now())
    # Progress.
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    total = models.IntegerField(default=0)
    handled = models.IntegerField(default=0)
    failed = models.IntegerField(default=0)
    missing = models.IntegerField(default=0)
    after_tenant_id = models.BigIntegerField(default=-1)
    after_id = models.BigIntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_until = models.DateTimeField(null=True)
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        db_table = "outbox_parked_jobs"
        verbose_name = "re-drive or discard job"
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"job {self.id}: {self.get_action_display()} ({self.state})"


class ReaderPositionRecord(OffsetColumns):
    """The readers' offset rows as the admin lists them (read-only).

    Unmanaged, with ``name`` standing in as the primary key for the admin
    (a consumer has one row per partition): a list, no page per row.
    """

    name = models.CharField(max_length=200, primary_key=True)

    class Meta:
        managed = False
        db_table = "consumer_offsets"
        verbose_name = "reader position"
        ordering = ["name", "partition"]
