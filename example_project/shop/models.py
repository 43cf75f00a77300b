"""A small multi-tenant shop: each merchant is a tenant.

Merchants and memberships are global (they are how a request finds its
tenant); everything else carries ``tenant_id`` and a row-level security
policy (shop/sql/0002_row_level_security.sql), as docs/roles.md recommends
for a project's tenant tables: ``tenant_id`` leads every key and index in the
database (the primary keys are ``(tenant_id, id)``), and a row refers to
another only within its tenant, by a composite foreign key
(shop/sql/0003_tenant_keys.sql). Django still knows each table's key as
``id``: the ids come from one identity per table, so ``id`` alone names a row,
and under row-level security a query sees its own tenant's rows only. The
foreign keys Django would make on ``id`` alone are off (``db_constraint=False``):
checked across tenants (PostgreSQL checks foreign keys without row-level
security), they would let a tenant refer to, and find out about, another's rows.
"""

from django.conf import settings
from django.db import models


class Merchant(models.Model):
    name = models.CharField(max_length=100, unique=True)

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    merchant = models.ForeignKey(Merchant, on_delete=models.CASCADE)

    def __str__(self) -> str:
        return f"{self.user} @ {self.merchant}"


class Product(models.Model):
    tenant_isolated = True

    tenant_id = models.BigIntegerField()
    sku = models.CharField(max_length=50)
    name = models.CharField(max_length=100)
    price_cents = models.PositiveIntegerField()
    stock = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant_id", "sku"], name="shop_product_sku")
        ]

    def __str__(self) -> str:
        return self.sku


class Order(models.Model):
    class Status(models.TextChoices):
        CREATED = "created"
        PAID = "paid"

    tenant_isolated = True

    tenant_id = models.BigIntegerField()
    # (tenant_id, product_id) refers to shop_product (tenant_id, id)
    product = models.ForeignKey(Product, on_delete=models.PROTECT, db_constraint=False,
                                db_index=False)
    quantity = models.PositiveIntegerField()
    total_cents = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.CREATED)
    email = models.EmailField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["tenant_id", "created_at"], name="shop_order_created"),
            models.Index(fields=["tenant_id", "product"], name="shop_order_product"),
        ]

    def __str__(self) -> str:
        return f"order {self.pk}"


class Payment(models.Model):
    tenant_isolated = True

    tenant_id = models.BigIntegerField()
    # (tenant_id, order_id) refers to shop_order (tenant_id, id); one payment per order
    order = models.ForeignKey(Order, on_delete=models.PROTECT, db_constraint=False,
                              db_index=False)
    amount_cents = models.PositiveIntegerField()
    charge_id = models.CharField(max_length=50, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant_id", "order"], name="shop_payment_order")
        ]

    def __str__(self) -> str:
        return f"payment {self.pk}"


class SalesDaily(models.Model):
    """A projection kept by the SalesProjection consumer (exactly once per order)."""

    tenant_isolated = True

    tenant_id = models.BigIntegerField()
    day = models.DateField()
    orders = models.PositiveIntegerField(default=0)
    units = models.PositiveIntegerField(default=0)
    revenue_cents = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant_id", "day"], name="shop_sales_day")]


class Receipt(models.Model):
    """One row per receipt e-mail sent by the Celery task."""

    tenant_isolated = True

    tenant_id = models.BigIntegerField()
    order_id = models.BigIntegerField()
    email = models.EmailField()
    sent_at = models.DateTimeField(auto_now_add=True)
