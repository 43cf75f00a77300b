"""Capturing an order's payment in phases (idempotency phases mode).

started          -> the local payment row                   (local only)
payment_created  -> the gateway charge, with a derived key  (one foreign call)
charged          -> order paid, ``order.paid`` published     (the receipt goes out via the outbox)
"""

from datetime import timedelta

from rest_framework.exceptions import APIException, NotFound

from idempotency import Finish, Phases, RecoveryPoint
from outbox import publish

from . import gateway
from .models import Order, Payment


class CardDeclined(APIException):
    """A definitive answer: stored with the key and replayed (a problem, like every error)."""

    status_code = 402
    default_detail = "The card was declined."
    default_code = "card_declined"


class AlreadyPaid(APIException):
    status_code = 409
    default_detail = "The order is already paid."
    default_code = "already_paid"


class CapturePayment(Phases):
    scope = "order.capture"
    completable = True
    # Short, so that the demo's crashed captures are taken over within seconds.
    lease = timedelta(seconds=5)

    def started(self, ctx):
        # Refusals here (404, 409) happen before anything of the request does:
        # the key is forgotten, nothing is left pending (docs/phases.md).
        pk = str(ctx.kwargs["pk"])
        order = Order.objects.filter(pk=int(pk)).first() if pk.isdigit() else None
        if order is None:  # not an order id, or RLS hides another merchant's order
            raise NotFound("No such order.")
        if order.status == Order.Status.PAID:
            raise AlreadyPaid()
        payment, _ = Payment.objects.get_or_create(
            tenant_id=ctx.tenant_id, order=order, defaults={"amount_cents": order.total_cents}
        )
        return RecoveryPoint("payment_created", payment_id=payment.pk, amount=order.total_cents)

    def payment_created(self, ctx):
        charge = gateway.charge(ctx.state["amount"], ctx.foreign_key("charge"))
        if charge.declined:
            raise CardDeclined()
        Payment.objects.filter(pk=ctx.state["payment_id"]).update(charge_id=charge.id)
        return RecoveryPoint("charged", charge_id=charge.id)

    def charged(self, ctx):
        updated = Order.objects.filter(pk=ctx.kwargs["pk"], status=Order.Status.CREATED).update(
            status=Order.Status.PAID
        )
        order = Order.objects.get(pk=ctx.kwargs["pk"])
        if updated:
            publish(
                "order.paid",
                {"order": order.pk, "email": order.email, "amount": order.total_cents},
                key=f"order:{order.pk}",
                aggregate_type="order",
                aggregate_id=order.pk,
            )
        return Finish(
            201,
            {"order": order.pk, "status": order.status, "charge": ctx.state["charge_id"]},
            headers={"Location": f"/orders/{order.pk}/"},
        )
