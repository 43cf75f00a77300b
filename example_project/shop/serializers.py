from django.db.models import F
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tenancy import current_tenant_id

from .models import Order, Product


class ProductSerializer(serializers.ModelSerializer):
    class Meta:
        model = Product
        fields = ["id", "sku", "name", "price_cents", "stock"]


@extend_schema_field({"type": "string", "minLength": 1, "maxLength": 50,
                      "description": "The SKU of one of the merchant's products."})
class SkuField(serializers.SlugRelatedField):
    """A product, by its SKU (what the schema can say of it: a non-empty string of 50 at most)."""


class OrderSerializer(serializers.ModelSerializer):
    product = SkuField(slug_field="sku", queryset=Product.objects.all())
    quantity = serializers.IntegerField(
        min_value=1, max_value=2**31 - 1, error_messages={"min_value": "Order at least one."}
    )

    class Meta:
        model = Order
        fields = ["id", "product", "quantity", "total_cents", "status", "email", "created_at"]
        read_only_fields = ["total_cents", "status", "created_at"]

    def create(self, validated_data):
        product = validated_data["product"]
        quantity = validated_data["quantity"]
        # Reserve stock atomically: the row lock serialises concurrent orders.
        reserved = Product.objects.filter(pk=product.pk, stock__gte=quantity).update(
            stock=F("stock") - quantity
        )
        if not reserved:
            raise OutOfStock()
        return Order.objects.create(
            tenant_id=current_tenant_id(),
            total_cents=product.price_cents * quantity,
            **validated_data,
        )


class OutOfStock(serializers.ValidationError):
    """409 problem, code ``out_of_stock``, with the field in ``errors``."""

    status_code = 409
    default_code = "out_of_stock"
    default_detail = "Not enough stock."

    def __init__(self):
        super().__init__({"product": ["Not enough stock."]}, code="out_of_stock")
