"""Outbox rows as the tests need them, written through the ORM on the app alias (create
them inside ``tenant_context`` of their tenant: row-level security applies).

Messages are published with :func:`outbox.publish` (tests/outbox/support/helpers.py:
``publish_as``, ``publish_many``), the way the app writes them; dead letters come from a
consumer that gives up (``MAX_ATTEMPTS``), as in production.
"""

from __future__ import annotations

import uuid

import factory
from django.db.models.functions import Now
from factory.django import DjangoModelFactory

from outbox.models import ReceivedMessage
from tenancy import current_tenant_id


class ReceivedMessageFactory(DjangoModelFactory):
    """A receiver's record of a message it handled (its de-duplication memory), just now."""

    class Meta:
        model = ReceivedMessage

    tenant_id = factory.LazyFunction(current_tenant_id)  # the context's tenant
    receiver = "r"
    message_id = factory.LazyFunction(uuid.uuid4)
    received_at = Now()
