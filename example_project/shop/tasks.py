"""Celery tasks fed by the outbox relay."""

from celery import shared_task
from django.core.mail import send_mail

from outbox import receiver

from .models import Receipt


@shared_task(name="shop.send_receipt")
@receiver("shop.send_receipt")
def send_receipt(message):
    """Send the receipt of a paid order once, however often the relay delivers it."""
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
