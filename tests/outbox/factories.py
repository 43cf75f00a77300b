"""Outbox rows as the tests need them, written through the ORM on the app alias (create
them inside ``tenant_context`` of their tenant: row-level security applies).

Messages are published with :func:`outbox.publish` (tests/outbox/support/helpers.py:
``publish_as``, ``publish_many``), the way the app writes them; dead letters come from a
consumer that gives up (``MAX_ATTEMPTS``), as in production, or, for the admin's tests,
from :class:`DeadLetterFactory`.
"""

from __future__ import annotations

import uuid

import factory
from django.db.models.functions import Now
from factory.django import DjangoModelFactory

from outbox.models import DeadLetter, ReceivedMessage
from tenancy import current_tenant_id


class ReceivedMessageFactory(DjangoModelFactory):
    """A receiver's record of a message it handled (its de-duplication memory), just now."""

    class Meta:
        model = ReceivedMessage

    tenant_id = factory.LazyFunction(current_tenant_id)  # the context's tenant
    receiver = "r"
    message_id = factory.LazyFunction(uuid.uuid4)
    received_at = Now()


class DeadLetterFactory(DjangoModelFactory):
    """A message of ``orders`` (tests' OrderRecorder) parked after 5 attempts, just now.

    Its id is taken from a range of its own (the table's identity, which the
    consumers' parking uses, starts at 1).
    """

    class Meta:
        model = DeadLetter

    tenant_id = factory.LazyFunction(current_tenant_id)  # the context's tenant
    id = factory.Sequence(lambda n: 1_000_000 + n)
    consumer = "orders"
    message_pk = factory.Sequence(lambda n: n + 1)
    message_id = factory.LazyFunction(uuid.uuid4)
    topic = "order.placed"
    key = factory.LazyAttribute(lambda o: f"key-{o.payload['sku']}")
    payload = factory.Sequence(lambda n: {"sku": f"sku-{n}"})
    headers = factory.LazyFunction(dict)
    message_created_at = Now()
    attempts = 5
    error = "Traceback (most recent call last):\n  File \"shop.py\", line 1\nBoom: it failed"
    parked_at = Now()
