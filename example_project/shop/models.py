"""A small multi-tenant shop: each merchant is a tenant.

Merchants and memberships are global (they are how a request finds its
tenant); everything else carries ``tenant_id`` and a row-level security
policy (shop/sql/0002_row_level_security.sql).
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
    product = models.ForeignKey(Product, on_delete=models.PROTECT)
    quantity = models.PositiveIntegerField()
    total_cents = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.CREATED)
    email = models.EmailField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["tenant_id", "created_at"], name="shop_order_created")]

    def __str__(self) -> str:
        return f"order {self.pk}"


class Payment(models.Model):
    tenant_isolated = True

    tenant_id = models.BigIntegerField()
    order = models.OneToOneField(Order, on_delete=models.PROTECT)
    amount_cents = models.PositiveIntegerField()
    charge_id = models.CharField(max_length=50, blank=True, default="")

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
