from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class IdempotencyKey(models.Model):
    """One client-supplied key and, once finished, the answer it replays.

    Rows are written by :mod:`idempotency.core` with SQL of its own (one
    statement per request); the model is for reading, the admin and the reaper.
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

    class Meta:
        db_table = "idempotency_keys"
        indexes = [
            models.Index(fields=["tenant_id", "expires_at"], name="idempotency_keys_expiry"),
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
