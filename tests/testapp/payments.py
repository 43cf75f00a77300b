"""A payment capture in phases mode, with crash points for the tests.

Phases: started (local payment row) -> payment_created (gateway charge with
a derived key, then the charge id stored) -> charged (receipt event through
the outbox, final answer).

Crash points: when the file named by ``DIO_CRASH_FILE`` holds ``raise:NAME``
or ``kill:NAME``, the point NAME raises (or SIGKILLs this process) once, and
the file is removed so the retry goes through.
"""

from __future__ import annotations

import os
import signal

import requests
from rest_framework import serializers

from idempotency.phases import Finish, Phases, RecoveryPoint, Retry
from outbox import publish
from tests.testapp.models import Order, Payment


class Crash(Exception):
    pass


def crash_point(name: str) -> None:
    path = os.environ.get("DIO_CRASH_FILE")
    if not path:
        return
    try:
        with open(path) as f:
            mode, _, point = f.read().strip().partition(":")
    except FileNotFoundError:
        return
    if point != name:
        return
    os.unlink(path)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise Crash(f"crash at {name}")


def charge(amount: int, key: str) -> requests.Response:
    url = os.environ["DIO_GATEWAY_URL"] + "/charges"
    try:
        response = requests.post(url, json={"amount": amount}, timeout=5,
                                 headers={"Idempotency-Key": key})
    except requests.RequestException as exc:
        raise Retry(f"The payment gateway did not answer: {exc}") from exc
    if response.status_code >= 500:
        raise Retry("The payment gateway is unavailable.")
    return response


class CaptureInput(serializers.Serializer):
    amount = serializers.IntegerField(min_value=1)


class CapturePayment(Phases):
    scope = "payment.capture"
    completable = True
    lease = 2
    data_fields = ("amount",)  # ctx.data: stored with the key, for retries and the completer

    def started(self, ctx):
        crash_point("after_key_insert")
        data = CaptureInput(data=ctx.data)
        data.is_valid(raise_exception=True)  # a DRF ValidationError: a final 400
        payment = Payment.objects.create(
            tenant_id=ctx.tenant_id, order_ref=ctx.kwargs["order"],
            amount=data.validated_data["amount"],
        )
        crash_point("in_local_phase")
        return RecoveryPoint("payment_created", payment_id=payment.id)

    def payment_created(self, ctx):
        crash_point("after_local_phase")
        answer = charge(ctx.data["amount"], ctx.foreign_key("charge"))
        if answer.status_code == 402:
            return Finish(402, {"detail": "The card was declined.", "code": "card_declined"})
        crash_point("after_gateway")
        charge_id = answer.json()["id"]
        Payment.objects.filter(id=ctx.state["payment_id"]).update(charge_id=charge_id)
        return RecoveryPoint("charged", charge_id=charge_id)

    def charged(self, ctx):
        crash_point("before_response")
        publish("payment.captured", {"payment": ctx.state["payment_id"]},
                key=f"order:{ctx.kwargs['order']}")
        return Finish(
            201,
            {"payment": ctx.state["payment_id"], "charge": ctx.state["charge_id"]},
            headers={"Location": f"/payments/{ctx.state['payment_id']}/"},
        )


class CaptureOrder(Phases):
    """Capturing an Order by its id from the URL: bad input meets the first phase.

    ``/orders/abc/capture/`` makes ``Order.objects.get`` raise ValueError (not
    a DRF exception), a missing id raises DoesNotExist; an order already
    captured is refused with ``Finish(409)``, a status that is not stored.
    """

    scope = "order.capture"
    completable = True

    def started(self, ctx):
        order = Order.objects.get(pk=ctx.kwargs["pk"])
        if order.note == "captured":
            return Finish(409, {"detail": "Already captured.", "code": "already_captured"})
        Order.objects.filter(pk=order.pk).update(note="captured")
        return Finish(201, {"order": order.pk})
