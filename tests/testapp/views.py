"""Views the tests drive; body fields steer what the handler does."""

import hashlib
import time
from pathlib import Path
from typing import ClassVar

from django.http import JsonResponse, StreamingHttpResponse
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import APIException, PermissionDenied
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from idempotency import IdempotentViewMixin, idempotent
from tenancy import TenantScopedViewMixin, current_tenant_id, tenant_context, tenant_scoped
from tenancy.resolver import resolve_tenant
from tests.testapp.models import Order, PlainOrder
from tests.testapp.payments import CaptureOrder, CapturePayment


class PaymentDeclined(APIException):
    status_code = 402
    default_detail = "The card was declined."
    default_code = "card_declined"


def hold(path: str) -> None:
    """Touch ``<path>.held``, then wait (a minute at most) while ``path`` exists: a test holds
    a request at a point of its choosing and lets it go by deleting the file."""
    Path(path + ".held").touch()
    deadline = time.monotonic() + 60
    while Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.01)


class OrderSerializer(serializers.ModelSerializer):
    sleep = serializers.FloatField(write_only=True, required=False, min_value=0, max_value=5)
    then = serializers.CharField(write_only=True, required=False)

    class Meta:
        model = Order
        fields = ["id", "sku", "quantity", "note", "sleep", "then"]

    def validate_quantity(self, value):
        if value < 1:
            raise serializers.ValidationError("Order at least one.")
        return value

    def create(self, validated_data):
        sleep = validated_data.pop("sleep", 0)
        then = validated_data.pop("then", "")
        order = Order.objects.create(tenant_id=current_tenant_id(), **validated_data)
        if sleep:
            time.sleep(sleep)
        if then == "raise":
            raise RuntimeError("the handler failed after writing")
        if then == "decline":
            raise PaymentDeclined()
        if then == "forbid":
            raise PermissionDenied("not today")
        return order


class OrderCreate(mixins.CreateModelMixin, viewsets.GenericViewSet):
    serializer_class = OrderSerializer
    parser_classes = [JSONParser, FormParser, MultiPartParser]

    def get_queryset(self):
        return Order.objects.all()

    def create(self, request, *args, **kwargs):
        if request.data.get("then") == "unavailable":
            Order.objects.create(tenant_id=current_tenant_id(), sku="unavailable")
            return Response({"detail": "try later"}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
        response = super().create(request, *args, **kwargs)
        response["Location"] = f"/orders/{response.data['id']}/"
        response["X-Not-Replayed"] = "1"
        return response


class OrderViewSet(IdempotentViewMixin, OrderCreate):
    idempotency_scope = "order.create"


class HoldingOrderSerializer(OrderSerializer):
    """The order's create, held where the body says (``hold``: a file, see :func:`hold`)."""

    hold = serializers.CharField(write_only=True, required=False)
    hold_at = serializers.ChoiceField(["start", "written"], write_only=True, required=False)

    class Meta(OrderSerializer.Meta):
        fields = [*OrderSerializer.Meta.fields, "hold", "hold_at"]

    def create(self, validated_data):
        held, at = validated_data.pop("hold", ""), validated_data.pop("hold_at", "written")
        if held and at == "start":  # before the handler's first statement
            hold(held)
        order = Order.objects.create(tenant_id=current_tenant_id(), **validated_data)
        if held and at == "written":  # the order written, not committed
            hold(held)
        return order


class HoldingOrderViewSet(OrderViewSet):
    """The ordinary create (scope order.create), which a test can hold mid-request."""

    serializer_class = HoldingOrderSerializer


class TenantOrderViewSet(OrderCreate):
    """The same create without the mixin: the benchmark's tenant baseline. A
    multi-tenant endpoint runs under RLS too, so it sets the tenant for its
    transaction (BEGIN, SET LOCAL, INSERT, COMMIT)."""

    def create(self, request, *args, **kwargs):
        with tenant_context(resolve_tenant(request)):
            return super().create(request, *args, **kwargs)


class OrderWaitingViewSet(OrderViewSet):
    """The same operation, but duplicates wait for the first request and replay."""

    idempotency_wait = 10


class OrderOptionalKeyViewSet(OrderViewSet):
    idempotency_scope = "order.create-optional"
    idempotency_key_required = False


class OrderShortTTLViewSet(OrderViewSet):
    idempotency_scope = "order.create-short"
    idempotency_ttl = 1


class OrderHookedViewSet(OrderViewSet):
    """The documented hooks, overridden."""

    idempotency_scope = "order.create-hooked"

    def get_idempotency_key(self, header_value):
        from idempotency.core import InvalidKey, parse_key

        key = parse_key(header_value)
        if not key.startswith("ord_"):
            raise InvalidKey("Order keys start with 'ord_'.")
        return key

    def perform_replay(self, stored):
        response = super().perform_replay(stored)
        response["X-Replay-Count"] = "counted"
        return response


class OrderWriteView(IdempotentViewMixin, APIView):
    """POST and PUT share one scope, so a key reused across methods is a mismatch."""

    idempotency_scope = "order.write"

    def post(self, request):
        order = Order.objects.create(tenant_id=current_tenant_id(), sku=request.data["sku"])
        return Response({"id": order.id}, status=201)

    put = post


class UploadView(IdempotentViewMixin, APIView):
    idempotency_scope = "upload.create"
    parser_classes = [MultiPartParser]

    def post(self, request):
        upload = request.data["file"]
        digest = hashlib.sha256(upload.read()).hexdigest()
        order = Order.objects.create(
            tenant_id=current_tenant_id(), sku=request.data.get("sku", "upload"), note=digest
        )
        return Response({"id": order.id, "sha256": digest}, status=201)


class PlainOrderSerializer(OrderSerializer):
    class Meta(OrderSerializer.Meta):
        model = PlainOrder

    def create(self, validated_data):
        validated_data.pop("sleep", None)
        validated_data.pop("then", None)
        tenant_id = resolve_tenant(self.context["request"])
        return PlainOrder.objects.create(tenant_id=tenant_id, **validated_data)


class PlainOrderViewSet(OrderCreate):
    """The benchmark's autocommit baseline: the same create and answer, into a
    table without row-level security, with no tenant context and no mixin. The
    INSERT runs in autocommit (one statement, one commit), as an endpoint of a
    single-tenant app does: what other idempotency packages are compared with."""

    serializer_class = PlainOrderSerializer

    def get_queryset(self):
        return PlainOrder.objects.all()


@idempotent(scope="order.create-plain-django")
def plain_django_create(request):
    import json

    if request.method == "GET":  # a safe method: no key, but the tenant's rows
        skus = Order.objects.order_by("id").values_list("sku", flat=True)
        return JsonResponse({"skus": list(skus)})
    data = json.loads(request.body)
    order = Order.objects.create(tenant_id=current_tenant_id(), sku=data["sku"])
    if data.get("then") == "raise":
        raise RuntimeError("boom")
    return JsonResponse({"id": order.id}, status=201)


class CaptureView(IdempotentViewMixin, APIView):
    """Phases mode: the program answers; this method only routes the request."""

    idempotency_phases = CapturePayment

    def post(self, request, order):
        raise AssertionError("phases views run their program, not this method")


class CaptureOrderView(IdempotentViewMixin, APIView):
    """Phases mode on an order id taken from the URL, unchecked (tests/testapp/payments.py)."""

    idempotency_phases = CaptureOrder

    def post(self, request, pk):
        raise AssertionError("phases views run their program, not this method")


# --- tenant-scoped reads (tenancy.TenantScopedViewMixin, tenancy.tenant_scoped) -------


class ScopedOrderViewSet(
    TenantScopedViewMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, OrderCreate
):
    """List, retrieve and create as the request's tenant, without idempotency keys."""

    def get_queryset(self):
        return Order.objects.order_by("id")


class IdempotentOrderBookViewSet(
    IdempotentViewMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, OrderCreate
):
    """An idempotent create whose list and retrieve run as the tenant too."""

    idempotency_scope = "order.book"

    def get_queryset(self):
        return Order.objects.order_by("id")


class LazySkusView(TenantScopedViewMixin, APIView):
    """Answers a queryset that DRF's JSON encoder evaluates only while rendering."""

    def get(self, request):
        return Response({"skus": Order.objects.order_by("id").values_list("sku", flat=True)})


class UnscopedStatusView(TenantScopedViewMixin, APIView):
    """Opted out: runs with no tenant, whoever asks."""

    tenant_scoped = False

    def get(self, request):
        return Response({"tenant": current_tenant_id(), "visible_orders": Order.objects.count()})


@tenant_scoped
def plain_scoped_orders(request):
    return JsonResponse({"skus": list(Order.objects.order_by("id").values_list("sku", flat=True))})


class TenantFromHeaderViewSet(ScopedOrderViewSet):
    """get_tenant() overridden: the tenant named by a header (for a test only)."""

    def get_tenant(self):
        return int(self.request.headers["X-Tenant"])


class OptedOutOrderBookViewSet(IdempotentOrderBookViewSet):
    """An idempotent view whose safe methods opted out of the tenant."""

    tenant_scoped = False


class StreamedSkusView(TenantScopedViewMixin, APIView):
    """Streams after the view returned: the iterator runs with no tenant."""

    def get(self, request):
        def skus():
            yield ",".join(Order.objects.order_by("id").values_list("sku", flat=True))

        return StreamingHttpResponse(skus())


# --- targets of the property tests (tests/idempotency/test_properties.py) -------------


class FuzzOrderSerializer(serializers.ModelSerializer):
    """The order's own fields only: no field steers the handler (sleep, raise...)."""

    class Meta:
        model = Order
        fields = ["id", "sku", "quantity", "note"]

    def create(self, validated_data):
        return Order.objects.create(tenant_id=current_tenant_id(), **validated_data)


class FuzzOrderViewSet(IdempotentViewMixin, mixins.CreateModelMixin, viewsets.GenericViewSet):
    idempotency_scope = "order.fuzz"
    serializer_class = FuzzOrderSerializer
    parser_classes = [JSONParser, FormParser, MultiPartParser]

    def get_queryset(self):
        return Order.objects.all()


@idempotent(scope="order.fuzz-django")
def fuzz_django_create(request):
    """Records any body by its digest: whatever arrives, the view itself cannot fail."""
    digest = hashlib.sha256(request.body).hexdigest()
    order = Order.objects.create(tenant_id=current_tenant_id(), sku="fuzz", note=digest)
    return JsonResponse({"id": order.id, "sha256": digest}, status=201)


class PublishingOrderViewSet(OrderViewSet):
    """Creates the order and announces it (order.placed, which the "orders" consumer
    and the Celery receivers handle): the request the operators' tests trace."""

    idempotency_scope = "order.create-published"

    def perform_create(self, serializer):
        from outbox import publish

        super().perform_create(serializer)
        order = serializer.instance
        publish("order.placed", {"id": order.pk, "sku": order.sku}, key=f"order:{order.pk}")


# --- the contract's other rows (tests/idempotency/test_contract.py) -------------------


class AnsweringView(IdempotentViewMixin, APIView):
    """Writes an order and announces it (order.placed), then answers as the body says.

    ``answer``: the status to answer (201 by default), ``"decline"`` (DRF's 402
    exception) or ``"raise"`` (an exception: a 500). ``calls`` lists the keys of
    the requests the handler ran for (a test empties it).
    """

    idempotency_scope = "order.answer"
    calls: ClassVar[list[str]] = []

    def post(self, request):
        from outbox import publish

        AnsweringView.calls.append(request.headers.get("Idempotency-Key", ""))
        order = Order.objects.create(tenant_id=current_tenant_id(),
                                     sku=str(request.data.get("sku", "tea")))
        publish("order.placed", {"id": order.pk, "sku": order.sku}, key=f"order:{order.pk}")
        answer = request.data.get("answer", 201)
        if answer == "raise":
            raise RuntimeError("the handler failed after writing and publishing")
        if answer == "decline":
            raise PaymentDeclined()
        return Response({"id": order.pk}, status=int(answer))


class RefuseEveryone(BasePermission):
    message = "Orders are closed."

    def has_permission(self, request, view):
        return False


class RefuseEveryRequest(BaseThrottle):
    def allow_request(self, request, view):
        return False

    def wait(self):
        return 7


class PermissionRefusedOrderViewSet(OrderViewSet):
    """The ordinary create (scope order.create) behind a permission that refuses everyone."""

    permission_classes = [IsAuthenticated, RefuseEveryone]


class ThrottledOrderViewSet(OrderViewSet):
    """The ordinary create (scope order.create) behind a throttle that refuses every request."""

    throttle_classes = [RefuseEveryRequest]


class DefaultScopeOrderViewSet(IdempotentViewMixin, OrderCreate):
    """No ``idempotency_scope``: the default, ``<module>.<ViewClass>.<action>``."""


class OrderScopeAndPrincipalHooksViewSet(OrderViewSet):
    """Two hooks of docs/mixin.md, as its examples override them: the scope per API
    version (``X-Api-Version``), the principal an API client (``X-Client``) rather than
    a user."""

    def get_idempotency_scope(self):
        return f"order.create.v{self.request.headers.get('X-Api-Version', '1')}"

    def get_idempotency_principal(self):
        return f"client:{self.request.headers['X-Client']}"


class OrderFingerprintHookViewSet(OrderScopeAndPrincipalHooksViewSet):
    """The fingerprint hook of docs/mixin.md's example: the body's ``sent_at`` ignored."""

    def get_idempotency_fingerprint(self):
        from idempotency import canonical_path, fingerprint  # as docs/mixin.md imports them

        data = {k: v for k, v in self.request.data.items() if k != "sent_at"}
        path = canonical_path(self.request.path, self.request.META.get("QUERY_STRING", ""))
        return fingerprint(self.request.method, path, self.get_idempotency_principal(), data)
