"""Celery tasks fed by the outbox relay."""

from celery import shared_task
from django.core.mail import send_mail

from outbox import ReceiverTask, receiver

from .models import Receipt


@shared_task(name="shop.send_receipt", base=ReceiverTask)
@receiver("shop.send_receipt")
def send_receipt(message):
    """Send the receipt of a paid order once, however often the relay delivers it.

    A failure (the database restarting, say) is retried with backoff, and the
    message parked after OUTBOX["RECEIVER_MAX_ATTEMPTS"]; a worker killed while
    sending leaves the message with Redis, which delivers it again.
    """
    payload = message.payload
    Receipt.objects.create(
        tenant_id=message.tenant_id, order_id=payload["order"], email=payload["email"]
    )
    send_mail(
        subject=f"Your receipt for order {payload['order']}",
        message=f"We charged {payload['amount'] / 100:.2f} for order {payload['order']}.",
        from_email=None,
        recipient_list=[payload["email"]],
    )


@shared_task(name="shop.ignore_event")
def ignore_event(envelope):
    """Events without a Celery task of their own (order.created goes to a consumer)."""
