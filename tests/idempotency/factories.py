"""Idempotency keys as the tests need them: rows of ``idempotency_keys``, written through the
ORM on the app alias (create them inside ``tenant_context`` of their tenant: row-level
security applies, as for the library's own writes).

Times are the database's: ``Now()`` plus or minus an interval, evaluated by PostgreSQL.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import factory
from django.db.models.functions import Now
from factory.django import DjangoModelFactory

from idempotency.models import IdempotencyKey
from tenancy import current_tenant_id


class KeyFactory(DjangoModelFactory):
    """A finished key (201, completed) of the context's tenant, live for a day."""

    class Meta:
        model = IdempotencyKey

    tenant_id = factory.LazyFunction(current_tenant_id)  # the context's tenant
    scope = "order.create"
    key = factory.Sequence(lambda n: f"k{n}")
    request_hash = "f" * 64
    request_method = "POST"
    request_path = "/orders/"
    state = "completed"
    status_code = 201
    created_at = Now()
    expires_at = Now() + timedelta(days=1)


class PendingKeyFactory(KeyFactory):
    """A phases-mode key left pending at ``recovery_point``, held by nobody."""

    scope = "payment.capture"
    request_path = "/payments/A1/capture/"
    state = "pending"
    status_code = None
    recovery_point = "payment_created"
    request_id = factory.LazyFunction(uuid.uuid4)
