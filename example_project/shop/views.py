"""The shop's API: products, idempotent orders, payment capture in phases.

The ``Idempotency-Key`` header and every answer the library gives (400, 403,
409, 413, 422, ``Idempotent-Replayed``) reach the OpenAPI schema through the
library's drf-spectacular extension; the views document only their own answers.
"""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action

from django_idempotency_outbox.openapi import problem
from django_idempotency_outbox.problems import PROBLEM_CONTENT_TYPE as PROBLEM
from idempotency import IdempotentViewMixin
from outbox import publish
from tenancy import TenantScopedViewMixin

from .models import Order, Product
from .phases import CapturePayment
from .serializers import OrderSerializer, ProductSerializer

#: Ids are positive integers: another path segment matches no URL (a 404 problem).
ID = r"[0-9]+"


class ProductViewSet(TenantScopedViewMixin, viewsets.ReadOnlyModelViewSet):
    """The merchant's products: reads run as the merchant, so RLS shows its rows."""

    serializer_class = ProductSerializer
    lookup_value_regex = ID

    def get_queryset(self):
        return Product.objects.order_by("sku")


class OrderViewSet(
    IdempotentViewMixin,  # lists and retrieves run as the merchant too
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.ListModelMixin,
    viewsets.GenericViewSet,
):
    serializer_class = OrderSerializer
    lookup_value_regex = ID

    def get_queryset(self):
        return Order.objects.select_related("product").order_by("-id")

    def get_idempotency_scope(self):
        return "order.create" if self.action == "create" else "order.capture"

    def get_idempotency_phases(self):
        return CapturePayment if self.action == "capture" else None

    @extend_schema(
        responses={
            201: OrderSerializer,
            (409, PROBLEM): problem(
                "Not enough stock, code `out_of_stock` (not stored: a retry with the same key "
                "runs again)"
            ),
        }
    )
    def create(self, request, *args, **kwargs):
        """Create an order, reserve its stock and announce it, in one transaction."""
        response = super().create(request, *args, **kwargs)
        response["Location"] = f"/orders/{response.data['id']}/"
        return response

    def perform_create(self, serializer):
        order = serializer.save()
        publish(
            "order.created",
            {
                "order": order.pk,
                "sku": order.product.sku,
                "quantity": order.quantity,
                "total": order.total_cents,
                "day": order.created_at.date().isoformat(),
            },
            key=f"order:{order.pk}",
            aggregate_type="order",
            aggregate_id=order.pk,
        )

    @extend_schema(
        request=None,
        responses={
            201: OpenApiResponse(OpenApiTypes.OBJECT, "Paid."),
            (402, PROBLEM): problem("The card was declined, code `card_declined` (stored)"),
            (404, PROBLEM): problem("No such order, code `not_found`"),
            (409, PROBLEM): problem("The order is already paid, code `already_paid`"),
            (503, PROBLEM): problem("The gateway failed, code `retry`; retry with the same key"),
        },
    )
    @action(detail=True, methods=["post"])
    def capture(self, request, pk=None):
        """Charge the order (phases mode: the CapturePayment program answers)."""
        raise AssertionError("unreachable: the phases program answers")
