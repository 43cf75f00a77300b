"""The example shop answers every bad input with a problem, never a 500, and writes nothing.

Issue 12's catalogue, sent to the shop served by gunicorn (tests/example/shop.py):
each answer is ``application/problem+json`` with its status and code, and the
rows requests write (keys, orders, payments, outbox messages) are counted
before and after by a superuser observer.
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
import requests

pytestmark = pytest.mark.live_server

ORDER = {"product": "TEA-GREEN", "quantity": 1, "email": "a@example.com"}


def problem(response: requests.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text[:500]
    assert response.headers["Content-Type"] == "application/problem+json", response.text[:300]
    body = response.json()
    assert body["code"] == code, body
    assert body["status"] == status and body["title"] and body["type"] == "about:blank"
    return body


def post(shop, path: str, data: bytes | str, key: str | None = "k-1",
         content_type: str = "application/json", user: str = "alice") -> requests.Response:
    headers = shop.headers(user, key, **{"Content-Type": content_type})
    return requests.post(shop.url + path, data=data, headers=headers, timeout=30)


@pytest.fixture
def unchanged(shop):
    """Asserts, after the test, that no request of it wrote anything."""
    before = shop.written()
    yield
    assert shop.written() == before


# --- the library's answers --------------------------------------------------------------


@pytest.mark.parametrize("field", ["product", "email"])
def test_a_lone_surrogate_is_400(shop, unchanged, field):
    body = json.dumps({**ORDER, field: "\ud800"})  # ensure_ascii: sent as \ud800
    problem(post(shop, "/orders/", body), 400, "body_invalid_text")


@pytest.mark.parametrize("depth", [900, 10_000])
def test_deep_nesting_is_400(shop, unchanged, depth):
    body = json.dumps(ORDER)[:-1] + ', "extra": ' + "[" * depth + "]" * depth + "}"
    problem(post(shop, "/orders/", body), 400, "body_too_deep")


def test_a_nul_in_the_capture_path_is_404(shop, unchanged):
    problem(post(shop, "/orders/%00/capture/", ""), 404, "not_found")


def test_a_non_numeric_order_id_on_capture_is_404(shop, unchanged):
    problem(post(shop, "/orders/abc/capture/", ""), 404, "not_found")


def test_an_order_of_no_one_is_404_on_capture(shop, unchanged):
    problem(post(shop, "/orders/99999999999999999999/capture/", ""), 404, "not_found")


@pytest.mark.parametrize("values", [["k1", "k2"], ["k", "k"]], ids=["two", "same-twice"])
def test_two_idempotency_key_headers_are_400(shop, unchanged, values):
    parts = urlsplit(shop.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    body = json.dumps(ORDER).encode()
    connection.putrequest("POST", "/orders/")
    for name, value in shop.headers("alice").items():
        connection.putheader(name, value)
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(len(body)))
    for value in values:
        connection.putheader("Idempotency-Key", value)
    connection.endheaders(body)
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    assert response.status == 400
    assert response.getheader("Content-Type") == "application/problem+json"
    assert answer["code"] == "idempotency_key_invalid"


def test_a_10_mb_body_is_413(shop, unchanged):
    body = json.dumps({**ORDER, "note": "x" * (10 * 1024 * 1024)})
    answer = problem(post(shop, "/orders/", body), 413, "body_too_large")
    assert answer["title"] == "Content Too Large"


def test_5000_form_fields_are_413(shop, unchanged):
    body = "&".join(f"f{i}=x" for i in range(5000))
    response = post(shop, "/orders/", body, content_type="application/x-www-form-urlencoded")
    problem(response, 413, "too_many_fields")


def test_a_missing_key_is_400(shop, unchanged):
    problem(post(shop, "/orders/", json.dumps(ORDER), key=None), 400, "idempotency_key_missing")


# --- the shop's own answers and DRF's, in the same format ----------------------------------


@pytest.mark.parametrize("product", ["TEA\u0000GREEN", "\u0000"])
def test_a_nul_in_the_product_is_400(shop, unchanged, product):
    body = json.dumps({**ORDER, "product": product})
    problem(post(shop, "/orders/", body), 400, "body_invalid_text")


@pytest.fixture
def no_order_written(shop):
    """Asserts, after the test, that it wrote no order and no outbox message (its key may
    be stored: a final 4xx is), whatever earlier tests left in the shop's database."""

    def orders() -> tuple[int, int]:
        return shop.count("shop_order"), shop.count("outbox_messages")

    before = orders()
    yield
    assert orders() == before


def test_a_validation_error_keeps_drfs_fields_in_errors(shop, no_order_written):
    answer = problem(post(shop, "/orders/", json.dumps({"quantity": 0}), key="v-1"),
                     400, "invalid")
    assert set(answer["errors"]) == {"product", "quantity", "email"}
    assert answer["errors"]["quantity"] == ["Order at least one."]


def test_huge_numbers_are_a_validation_problem(shop, no_order_written):
    body = json.dumps({**ORDER, "quantity": 10**30})
    answer = problem(post(shop, "/orders/", body, key="n-1"), 400, "invalid")
    assert "quantity" in answer["errors"]


def test_out_of_stock_is_409_problem_and_not_stored(shop, unchanged):
    body = json.dumps({**ORDER, "quantity": 1_000_000})
    answer = problem(post(shop, "/orders/", body, key="s-1"), 409, "out_of_stock")
    assert answer["errors"] == {"product": ["Not enough stock."]}


def test_malformed_json_is_400_parse_error(shop, unchanged):
    problem(post(shop, "/orders/", '{"product": '), 400, "parse_error")


def test_an_unsupported_media_type_is_415(shop, unchanged):
    problem(post(shop, "/orders/", "x", content_type="text/plain"), 415, "unsupported_media_type")


def test_no_token_is_401_with_www_authenticate(shop, unchanged):
    response = requests.post(shop.url + "/orders/", json=ORDER, timeout=30)
    problem(response, 401, "not_authenticated")
    assert response.headers["WWW-Authenticate"] == "Token"


def test_a_wrong_token_is_401_authentication_failed(shop, unchanged):
    response = requests.get(shop.url + "/orders/", headers={"Authorization": "Token nope"},
                            timeout=30)
    problem(response, 401, "authentication_failed")


def test_another_merchants_order_is_404(shop, unchanged):
    response = requests.get(shop.url + "/orders/1/", headers=shop.headers("bob"), timeout=30)
    problem(response, 404, "not_found")


def test_a_method_the_view_lacks_is_405(shop, unchanged):
    response = requests.put(shop.url + "/orders/", json=ORDER, headers=shop.headers(), timeout=30)
    answer = problem(response, 405, "method_not_allowed")
    assert "PUT" in answer["detail"]
    assert "POST" in response.headers["Allow"]


def test_an_unacceptable_accept_is_406(shop, unchanged):
    response = requests.get(shop.url + "/products/",
                            headers=shop.headers(Accept="text/csv"), timeout=30)
    problem(response, 406, "not_acceptable")


def test_a_url_of_nothing_is_404_problem(shop, unchanged):
    problem(requests.get(shop.url + "/nothing/here/", timeout=30), 404, "not_found")


def test_a_declined_card_is_a_stored_problem(shop):
    created = requests.post(shop.url + "/orders/", json=ORDER, headers=shop.headers(key="o-decl"),
                            timeout=30)
    assert created.status_code == 201, created.text
    order = created.json()["id"]
    gateway = shop.gateway
    requests.post(gateway + "/control", json={"decline": True}, timeout=5).raise_for_status()
    try:
        first = post(shop, f"/orders/{order}/capture/", "", key="c-decl")
        again = post(shop, f"/orders/{order}/capture/", "", key="c-decl")
    finally:
        requests.post(gateway + "/control", json={"decline": False}, timeout=5)
    problem(first, 402, "card_declined")
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"

