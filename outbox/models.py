"""The outbox's tables.

Rows of ``outbox_messages`` are written by :func:`outbox.publish` with one SQL
statement and read by the relay and the consumers with SQL of their own; the
models are for reading, the admin and the tests. The parts Django cannot
express (the trigger that gives each message its id and marks its
transaction as a publisher in flight, the ``xid8`` default, the SQL functions
of the fence, the delivery index and the row-level security policies) are in
``outbox/sql/``.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.functions import Now

from tenancy.privileges import APP, DML, SYSTEM, WORKER, TablePrivileges

#: Each role's privileges on the outbox's tables (tenancy.privileges collects
#: them: the grants of migrate, check tenancy.E017/E018, docs/roles.md).
#:
#: - app (the web process, receivers): publishes (the outbox is append-only),
#:   parks and re-drives as its tenant, remembers received messages; nothing
#:   on the shared delivery state (offsets, leases) nor on the consumers'
#:   failures.
#: - worker (consumers, relays): the only role that may lock (``FOR UPDATE``
#:   needs UPDATE), advance and lease offsets; handlers publish and park, as
#:   their message's tenant.
#: - system (cross-tenant reads and upkeep): reads the stream, offsets,
#:   failures and dead letters; deletes what retention deletes; writes the
#:   re-drive and discard jobs people ask for (the jobs act on dead letters
#:   as each message's tenant, on the app role).
#:
#: The fence's key (the proofs that a transaction published, docs/guarantees.md)
#: is no role's but the owner's. django-tasks-db's queue is the worker role's
#: alone: the relay enqueues every tenant's envelopes into it (no tenant column,
#: no row-level security) and its worker claims them, both on the worker alias
#: (docs/django-tasks.md). A table that does not exist (no django-tasks-db) is
#: left out.
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
    """One event, written in the same transaction as the change it announces.

    Append-only: the app role may insert and read (its own tenant's rows), never
    update or delete. ``id`` is given by the database (a trigger; an insert that
    names one is refused), which first marks the writing transaction as a
    publisher in flight for the row's tenant until it ends; readers follow ids
    in order and, of each tenant, read only below the lowest id such a
    publisher may still commit, so a message committed late is never skipped
    (see docs/guarantees.md). ``xid`` is the writing transaction's id, kept for
    people (it orders nothing).
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
    """How far one reader (a consumer partition, or a relay) has read.

    Global, not per tenant: a reader follows the one stream of all tenants.
    The position is ``last_id``, the id of the last message passed, for every
    tenant but those in ``held`` (tenant id -> the last id passed of that
    tenant, while a publisher of it was in flight; :class:`outbox.stream.Position`).
    ``attempts``
    and ``retry_at`` count and pace the failures of the message at the head of
    this partition; what failed, and how, is tenant data and is kept in
    :class:`ConsumerFailure`, under row-level security. ``lease_owner`` and
    ``lease_until`` are used by relays only. Only the worker role may write
    these rows, and the app role has no privilege on them (docs/roles.md).
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
    """A re-drive or discard of the parked messages a filter matches, done in the background.

    Written by the admin's actions and ``outbox_parked --redrive/--discard
    --background`` (on the system alias), worked by ``outbox_parked --work``
    or the ``outbox.work_parked_jobs`` task (:mod:`outbox.deadletters`): in
    batches along ``(tenant_id, id)``, each batch's end written here, so a
    worker that dies is followed, once its lease runs out, by another that
    goes on from ``after_tenant_id``/``after_id``. Rows above ``upto_id`` (parked
    after the job was asked for) are left alone. Not tenant data: it names
    tenants, it holds none of their rows.
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
