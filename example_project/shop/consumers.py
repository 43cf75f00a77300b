"""The sales projection: an in-database consumer, exactly once per order."""

from datetime import date

from django.db.models import F

from outbox import Consumer

from .models import SalesDaily


class SalesProjection(Consumer):
    name = "sales"
    topics = ["order.created"]
    # Give up on a failing message quickly, so that the scenario shows one parked.
    max_attempts = 3
    retry_backoff = 0.2

    def handle(self, message):
        payload = message.payload
        row, _ = SalesDaily.objects.get_or_create(
            tenant_id=message.tenant_id, day=date.fromisoformat(payload["day"])
        )
        SalesDaily.objects.filter(pk=row.pk).update(
            orders=F("orders") + 1,
            units=F("units") + payload["quantity"],
            revenue_cents=F("revenue_cents") + payload["total"],
        )
