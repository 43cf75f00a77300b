"""The idempotency app's tables, and who may do what to them."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from tenancy.privileges import APP, DML, SYSTEM, TablePrivileges

#: Each role's privileges on this app's tables (tenancy.privileges collects
#: them: the grants of migrate, check tenancy.E017/E018, docs/roles.md). The
#: web process reads and writes its tenant's keys; the system role reads,
#: finishes (the reaper's give-up) and deletes expired keys across tenants,
#: and holds the key reaper's lease row; nobody else may touch the lease.
TABLE_PRIVILEGES: TablePrivileges = {
    "idempotency_keys": {APP: DML, SYSTEM: ("SELECT", "UPDATE", "DELETE")},
    "idempotency_leases": {SYSTEM: ("SELECT", "UPDATE")},
}


class IdempotencyKey(models.Model):
    """One client-supplied key and, once finished, the answer it replays.

    Every statement on the table is in :mod:`idempotency.store`: hand-written
    SQL on the request path (one statement per step), the ORM on this model
    for the upkeep that gains nothing from SQL of its own.
    """

    class State(models.TextChoices):
        PENDING = "pending"
        COMPLETED = "completed"
        FAILED = "failed"

    tenant_isolated = True

    pk = models.CompositePrimaryKey("tenant_id", "scope", "key")
    tenant_id = models.BigIntegerField()
    scope = models.CharField(max_length=200)
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    request_method = models.CharField(max_length=10)
    request_path = models.TextField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    status_code = models.SmallIntegerField(null=True)
    response = models.BinaryField(null=True)
    response_headers = models.JSONField(null=True)
    created_at = models.DateTimeField(db_default=Now())
    completed_at = models.DateTimeField(null=True)
    expires_at = models.DateTimeField()
    # Phases mode (idempotency.phases): the key is committed before the work,
    # and these fields carry the request across phases, retries and crashes.
    recovery_point = models.CharField(max_length=100, blank=True, db_default="")
    phase_state = models.JSONField(null=True)
    request_data = models.JSONField(null=True)
    request_id = models.UUIDField(null=True)
    lease_token = models.BigIntegerField(db_default=0)
    locked_until = models.DateTimeField(null=True)
    updated_at = models.DateTimeField(null=True)
    # Runs of the completer that failed again; it gives up at COMPLETE_MAX_ATTEMPTS.
    completer_runs = models.IntegerField(db_default=0)

    class Meta:
        db_table = "idempotency_keys"
        indexes = [
            models.Index(fields=["tenant_id", "expires_at"], name="idempotency_keys_expiry"),
            # The few pending keys (phases mode), for the reaper's and the completer's
            # reads across tenants: without it each reads the whole table.
            models.Index(fields=["tenant_id", "created_at"], condition=models.Q(state="pending"),
                         name="idempotency_keys_pending"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=["pending", "completed", "failed"]),
                name="idempotency_keys_state_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(state="pending") | models.Q(status_code__isnull=False),
                name="idempotency_keys_finished_has_status",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.scope}/{self.key} ({self.state})"


class IdempotencyKeyRecord(models.Model):
    """The keys as the admin lists them (read-only, every tenant).

    Django 5.2's admin cannot register a model with a composite primary key,
    so this unmanaged model maps the same table with ``key`` standing in as
    the primary key. It is not unique across tenants and scopes, so the admin
    only lists rows: there is no page per row.
    """

    tenant_id = models.BigIntegerField()
    scope = models.CharField(max_length=200)
    key = models.CharField(max_length=255, primary_key=True)
    request_method = models.CharField(max_length=10)
    request_path = models.TextField()
    state = models.CharField(max_length=16, choices=IdempotencyKey.State.choices)
    status_code = models.SmallIntegerField(null=True)
    recovery_point = models.CharField(max_length=100)
    lease_token = models.BigIntegerField()
    locked_until = models.DateTimeField(null=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField(null=True)
    completed_at = models.DateTimeField(null=True)
    expires_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "idempotency_keys"
        verbose_name = "idempotency key"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.scope}/{self.key} ({self.state})"
