from django.db.models import F
from rest_framework import serializers

from tenancy import current_tenant_id

from .models import Order, Product


class ProductSerializer(serializers.ModelSerializer):
    class Meta:
        model = Product
        fields = ["id", "sku", "name", "price_cents", "stock"]


class OrderSerializer(serializers.ModelSerializer):
    product = serializers.SlugRelatedField(slug_field="sku", queryset=Product.objects.all())

    class Meta:
        model = Order
        fields = ["id", "product", "quantity", "total_cents", "status", "email", "created_at"]
        read_only_fields = ["total_cents", "status", "created_at"]

    def validate_quantity(self, value):
        if value < 1:
            raise serializers.ValidationError("Order at least one.")
        return value

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
