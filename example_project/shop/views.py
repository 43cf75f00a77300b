"""The shop's API: products, idempotent orders, payment capture in phases."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action

from idempotency import IdempotentViewMixin
from outbox import publish
from tenancy import TenantScopedViewMixin

from .models import Order, Product
from .phases import CapturePayment
from .serializers import OrderSerializer, ProductSerializer

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=True,
    description=(
        "A unique key per operation (a UUID), sent again unchanged on every retry. "
        "1-255 printable ASCII characters, bare or as a quoted string."
    ),
)
PROBLEM = OpenApiTypes.OBJECT
IDEMPOTENCY_ERRORS = {
    400: OpenApiResponse(PROBLEM, "Missing or invalid Idempotency-Key, or invalid body."),
    403: OpenApiResponse(PROBLEM, "The user belongs to no merchant."),
    409: OpenApiResponse(
        PROBLEM, "A request with this key is still in progress (see Retry-After)."
    ),
    422: OpenApiResponse(PROBLEM, "The key was already used for a different request."),
}


class ProductViewSet(TenantScopedViewMixin, viewsets.ReadOnlyModelViewSet):
    """The merchant's products: reads run as the merchant, so RLS shows its rows."""

    serializer_class = ProductSerializer

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

    def get_queryset(self):
        return Order.objects.select_related("product").order_by("-id")

    def get_idempotency_scope(self):
        return "order.create" if self.action == "create" else "order.capture"

    def get_idempotency_phases(self):
        return CapturePayment if self.action == "capture" else None

    @extend_schema(
        parameters=[IDEMPOTENCY_KEY], responses={201: OrderSerializer, **IDEMPOTENCY_ERRORS}
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
        parameters=[IDEMPOTENCY_KEY],
        responses={
            201: OpenApiResponse(OpenApiTypes.OBJECT, "Paid."),
            402: OpenApiResponse(PROBLEM, "The card was declined (stored and replayed)."),
            503: OpenApiResponse(PROBLEM, "The gateway failed; retry with the same key."),
            **IDEMPOTENCY_ERRORS,
        },
    )
    @action(detail=True, methods=["post"])
    def capture(self, request, pk=None):
        """Charge the order (phases mode: the CapturePayment program answers)."""
        raise AssertionError("unreachable: the phases program answers")
