"""@idempotent: the same contract for a plain Django view."""

import json

from django.test import Client

from tests.helpers import count_rows


def post(client, key, body, user="alice"):
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(
        "/django-orders/", json.dumps(body), content_type="application/json", headers=headers
    )


def test_plain_django_view_runs_once_and_replays(settings):
    settings.TENANCY = {**settings.TENANCY, "TENANT_RESOLVER": lambda request: 1}
    client = Client()
    first = post(client, "d1", {"sku": "tea"})
    again = post(client, "d1", {"sku": "tea"})
    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert count_rows("testapp_order") == 1


def test_plain_django_view_mismatch_missing_key_and_rollback(settings):
    settings.TENANCY = {**settings.TENANCY, "TENANT_RESOLVER": lambda request: 1}
    client = Client(raise_request_exception=False)
    assert post(client, None, {"sku": "tea"}).status_code == 400
    assert post(client, "d1", {"sku": "tea", "then": "raise"}).status_code == 500
    assert count_rows("testapp_order") == 0
    assert count_rows("idempotency_keys") == 0
    assert post(client, "d1", {"sku": "tea"}).status_code == 201
    assert post(client, "d1", {"sku": "coffee"}).status_code == 422
    assert count_rows("testapp_order") == 1
