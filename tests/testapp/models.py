from django.db import models

from tenancy import TenantForeignKey


class Order(models.Model):
    """A tenant's order: the side effect the idempotency tests count."""

    tenant_isolated = True

    tenant_id = models.BigIntegerField()
    sku = models.CharField(max_length=50)
    quantity = models.IntegerField(default=1)
    note = models.TextField(blank=True, default="")

    class Meta:
        db_table = "testapp_order"
        indexes = [models.Index(fields=["tenant_id", "sku"], name="testapp_order_tenant_sku")]


class PlainOrder(models.Model):
    """The same order without row-level security: the benchmark's autocommit baseline.

    Same columns and indexes as :class:`Order`, so an insert does the same work
    in the table; only the policy (and with it the tenant setting and the
    transaction around it) is missing.
    """

    tenant_id = models.BigIntegerField()
    sku = models.CharField(max_length=50)
    quantity = models.IntegerField(default=1)
    note = models.TextField(blank=True, default="")

    class Meta:
        db_table = "testapp_plain_order"
        indexes = [models.Index(fields=["tenant_id", "sku"], name="testapp_plain_order_tenant_sku")]


class Payment(models.Model):
    """A local payment row of the phases-mode capture (tests/testapp/payments.py)."""

    tenant_isolated = True

    tenant_id = models.BigIntegerField()
    order_ref = models.CharField(max_length=50)
    amount = models.IntegerField()
    charge_id = models.CharField(max_length=50, null=True)  # noqa: DJ001 - NULL until charged

    class Meta:
        db_table = "testapp_payment"
        indexes = [models.Index(fields=["tenant_id", "order_ref"], name="testapp_payment_order")]


class Refund(models.Model):
    """A refund of an order: a reference between tenant-isolated models (tenancy.references)."""

    tenant_isolated = True

    tenant_id = models.BigIntegerField()
    order = TenantForeignKey(Order, on_delete=models.CASCADE)
    amount = models.IntegerField()

    class Meta:
        db_table = "testapp_refund"
