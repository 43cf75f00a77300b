"""The shop's client of the payment gateway (example_project/gateway.py)."""

import logging
from dataclasses import dataclass

import requests
from django.conf import settings

from idempotency import Retry

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Charge:
    id: str
    declined: bool


def charge(amount_cents: int, idempotency_key: str) -> Charge:
    """Charge a card; transient failures raise Retry, declines are a definitive answer."""
    try:
        response = requests.post(
            settings.GATEWAY_URL + "/charges",
            json={"amount": amount_cents},
            headers={"Idempotency-Key": idempotency_key},
            timeout=settings.GATEWAY_TIMEOUT,
        )
    except requests.Timeout as exc:
        raise Retry("The payment gateway timed out; retry.", retry_after=2) from exc
    except requests.RequestException as exc:
        logger.warning("payment gateway unreachable: %s", exc)  # the detail stays in the log
        raise Retry("The payment gateway is unreachable; retry.", retry_after=2) from exc
    if response.status_code == 402:
        return Charge(id="", declined=True)
    if response.status_code >= 500:
        raise Retry("The payment gateway is unavailable; retry.", retry_after=2)
    response.raise_for_status()
    return Charge(id=response.json()["id"], declined=False)
