"""The test app's phases programs: ``IdempotencyConfig.ready()`` imports this module.

``CapturePayment`` lives in payments.py with its crash points; importing it
here makes every process know it, not only those that load the URLconf.
``RecordDelivery`` is defined only here and imported by nothing else, so a
process finds it only through that discovery (tests/idempotency/test_discovery.py).
"""

from idempotency import Finish, Phases, RecoveryPoint, Retry
from tests.testapp.models import Order
from tests.testapp.payments import CapturePayment

__all__ = ["CapturePayment", "RecordDelivery"]


class RecordDelivery(Phases):
    """Records a delivery; with ``fail_first``, the first run fails transiently.

    The failure comes after a committed recovery point, so the key stays
    pending for the completer (a failure before anything happened forgets it).
    """

    scope = "test.delivery"
    completable = True
    data_fields = ("sku", "fail_first")

    def started(self, ctx):
        return RecoveryPoint("booked")

    def booked(self, ctx):
        if ctx.data.get("fail_first") and ctx.attempt == 1:
            raise Retry("The courier did not answer.")
        order = Order.objects.create(tenant_id=ctx.tenant_id, sku=ctx.data["sku"])
        return Finish(201, {"order": order.pk})
