"""The test app's rows as the tests need them: orders, written through the ORM on the app
alias (create them inside ``tenant_context`` of their tenant, as the app would)."""

from __future__ import annotations

import factory
from factory.django import DjangoModelFactory

from tenancy import current_tenant_id
from tests.testapp.models import Order


class OrderFactory(DjangoModelFactory):
    """An order of one item, of the context's tenant."""

    class Meta:
        model = Order

    tenant_id = factory.LazyFunction(current_tenant_id)  # the context's tenant
    sku = factory.Sequence(lambda n: f"sku-{n}")
    quantity = 1
    note = ""
