"""Bad input is answered with a documented problem, never a 500, and leaves nothing written.

One test per input of issue 12's catalogue (and its neighbours), through the
DRF mixin, the plain Django decorator and phases mode. "Nothing written" is
counted by an observer that sees every tenant: no key row, no order, no
outbox message, no payment.
"""

from __future__ import annotations

import http.client
import json

import pytest
from django.test import override_settings

from idempotency.conf import MAX_BODY_DEPTH
from tests.helpers import count_rows, statements_on_every_alias
from tests.testapp.payments import CapturePayment


def _tenant_of(request):
    """The test resolver, plus tenant 1 for a plain Django request from alice (no DRF user)."""
    tenant = getattr(request.user, "tenant_id", None)
    return tenant if tenant is not None or request.headers.get("X-User") != "alice" else 1


@pytest.fixture(autouse=True)
def _plain_views_find_their_tenant(settings):
    settings.TENANCY = {**settings.TENANCY, "TENANT_RESOLVER": _tenant_of}


def nothing_written() -> bool:
    tables = ("idempotency_keys", "testapp_order", "outbox_messages", "testapp_payment")
    return all(count_rows(table) == 0 for table in tables)


def problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert body["code"] == code, body
    assert body["status"] == status
    return body


def post_raw(client, path: str, body: bytes | str, key: str | None = "k1",
             content_type: str = "application/json", user: str = "alice"):
    headers = {"X-User": user}
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.generic("POST", path, body, content_type=content_type, headers=headers)


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


# --- the body ------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/orders/", "/django-orders/"])
@pytest.mark.parametrize(
    "body",
    ['{"sku": "\\ud800", "quantity": 1}', '{"sku": "tea", "\\udfff": 1}',
     '{"sku": "tea", "note": ["ok", {"deeper": "\\ud83d"}]}'],
    ids=["value", "key", "nested"],
)
def test_a_lone_surrogate_is_400_body_invalid_text(client, path, body):
    problem(post_raw(client, path, body), 400, "body_invalid_text")
    assert nothing_written()


def test_a_surrogate_pair_is_text_and_runs(client):
    response = post_raw(client, "/orders/", '{"sku": "\\ud83d\\ude00", "quantity": 1}')
    assert response.status_code == 201
    assert json.loads(response.content)["sku"] == "\U0001f600"


@pytest.mark.parametrize("path", ["/orders/", "/django-orders/"])
@pytest.mark.parametrize("depth", [900, 10_000])
def test_deep_nesting_is_400_body_too_deep(client, path, depth):
    body = '{"sku": "tea", "quantity": 1, "extra": ' + nested(depth) + "}"
    problem(post_raw(client, path, body), 400, "body_too_deep")
    assert nothing_written()


def test_max_body_depth_counts_every_array_and_object(client):
    limit = MAX_BODY_DEPTH  # 100
    at_limit = '{"sku": "tea", "quantity": 1, "extra": ' + nested(limit - 1) + "}"
    assert post_raw(client, "/orders/", at_limit, key="at").status_code == 201
    over = '{"sku": "tea", "quantity": 1, "extra": ' + nested(limit) + "}"
    problem(post_raw(client, "/orders/", over, key="over"), 400, "body_too_deep")
    assert count_rows("idempotency_keys") == 1  # the one at the limit


@pytest.mark.parametrize("path", ["/orders/", "/django-orders/"])
def test_a_10_mb_body_is_413_body_too_large(client, path):
    body = json.dumps({"sku": "tea", "quantity": 1, "note": "x" * (10 * 1024 * 1024)})
    body = problem(post_raw(client, path, body), 413, "body_too_large")
    assert body["title"] == "Content Too Large"
    assert nothing_written()


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_the_size_limit_is_djangos_setting(client):
    small = json.dumps({"sku": "tea", "quantity": 1, "note": "x" * 900})
    assert post_raw(client, "/orders/", small, key="small").status_code == 201
    large = json.dumps({"sku": "tea", "quantity": 1, "note": "x" * 1000})
    problem(post_raw(client, "/orders/", large, key="large"), 413, "body_too_large")
    assert count_rows("idempotency_keys") == 1


@pytest.mark.parametrize("path", ["/orders/", "/django-orders/"])
def test_5000_form_fields_are_413_too_many_fields(client, path):
    body = "&".join(f"f{i}=x" for i in range(5000))
    response = post_raw(client, path, body, content_type="application/x-www-form-urlencoded")
    problem(response, 413, "too_many_fields")
    assert nothing_written()


def test_too_many_multipart_fields_are_413_too(client):
    fields = {f"f{i}": "x" for i in range(1001)}
    response = client.post("/orders/", fields, headers={"X-User": "alice", "Idempotency-Key": "m"})
    problem(response, 413, "too_many_fields")
    assert nothing_written()


@override_settings(DATA_UPLOAD_MAX_NUMBER_FILES=2)
def test_too_many_files_are_413_too_many_files(client):
    from django.core.files.uploadedfile import SimpleUploadedFile

    files = {f"file{i}": SimpleUploadedFile(f"{i}.txt", b"x") for i in range(3)}
    response = client.post("/uploads/", files, headers={"X-User": "alice", "Idempotency-Key": "u"})
    problem(response, 413, "too_many_files")
    assert nothing_written()


def test_huge_numbers_are_the_views_to_judge_never_a_500(client):
    body = '{"sku": "tea", "quantity": 1' + "0" * 400 + ', "note": ' + "9" * 4000 + "}"
    response = post_raw(client, "/orders/", body)
    assert response.status_code == 400  # DRF: not a valid integer (stored as failed)
    assert count_rows("testapp_order") == 0


def test_more_digits_than_python_converts_are_a_parse_error_not_a_500(client):
    body = '{"sku": "tea", "quantity": ' + "9" * 5000 + "}"
    response = post_raw(client, "/orders/", body)
    assert response.status_code == 400
    assert nothing_written()


def test_duplicate_json_keys_count_as_the_parser_reads_them(client):
    first = post_raw(client, "/orders/", '{"sku": "tea", "sku": "coffee", "quantity": 1}')
    assert json.loads(first.content)["sku"] == "coffee"  # the last one, as json.loads keeps
    again = post_raw(client, "/orders/", '{"quantity": 1, "sku": "coffee"}')
    assert again["Idempotent-Replayed"] == "true"


# --- the key header --------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    ["k1,k2", "k,k", "k1, k2", '"k1", "k2"', '"k","k"', '"k", k', 'k, "k"', "k1,"],
)
def test_more_than_one_key_value_is_400(client, header):
    body = problem(post_raw(client, "/orders/", '{"sku": "tea"}', key=header),
                   400, "idempotency_key_invalid")
    assert "more than one value" in body["detail"]
    assert nothing_written()


@pytest.mark.parametrize("header", ["a b", "a\tb", 'ab"', '"ab";p=1'])
def test_other_malformed_keys_are_400(client, header):
    problem(post_raw(client, "/orders/", '{"sku": "tea"}', key=header),
            400, "idempotency_key_invalid")
    assert nothing_written()


def test_a_comma_inside_a_quoted_key_is_one_key(client):
    assert post_raw(client, "/orders/", '{"sku": "tea"}', key='"a,b"').status_code == 201
    assert count_rows("idempotency_keys", "key = 'a,b'") == 1


@pytest.mark.live_server
@pytest.mark.parametrize("values", [["k1", "k2"], ["k", "k"], ['"k"', '"k"']],
                         ids=["two", "same-twice", "quoted-twice"])
def test_a_repeated_header_through_gunicorn_is_400(wsgi_server, values):
    """gunicorn joins repeated headers with a comma: the key is refused, not changed."""
    connection = http.client.HTTPConnection("127.0.0.1", wsgi_server.port, timeout=10)
    body = json.dumps({"sku": "tea", "quantity": 1})
    connection.putrequest("POST", "/orders/")
    connection.putheader("X-User", "alice")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(len(body)))
    for value in values:
        connection.putheader("Idempotency-Key", value)
    connection.endheaders(body.encode())
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    assert response.status == 400
    assert response.getheader("Content-Type") == "application/problem+json"
    assert answer["code"] == "idempotency_key_invalid"
    assert nothing_written()


# --- the path, and phases mode's stored data --------------------------------------------


def test_a_nul_in_the_path_is_400_path_invalid_in_phases_mode(client):
    response = post_raw(client, "/payments/a%00b/capture/", '{"amount": 5}')
    problem(response, 400, "path_invalid")
    assert nothing_written()


def test_a_nul_in_the_path_is_400_in_transaction_mode_too():
    from django.test import RequestFactory

    from tests.testapp.views import plain_django_create

    request = RequestFactory().post(
        "/django-orders/\x00", '{"sku": "tea"}', content_type="application/json",
        headers={"Idempotency-Key": "nul"},
    )
    request.user = type("U", (), {"is_authenticated": True, "pk": 1, "tenant_id": 1})()
    problem(plain_django_create(request), 400, "path_invalid")
    assert nothing_written()


def test_phases_mode_stores_only_the_fields_the_program_reads(client, gateway):
    body = {"amount": 5, "junk": "x" * 100_000}
    response = post_raw(client, "/payments/o1/capture/", json.dumps(body))
    assert response.status_code == 201, response.content
    from tests.helpers import observer

    with observer() as conn:
        (stored,) = conn.execute("SELECT request_data FROM idempotency_keys").fetchone()
    assert stored == {"data": {"amount": 5}, "kwargs": {"order": "o1"}, "principal": "User:1"}


def test_phases_data_over_max_stored_data_is_413(client, monkeypatch):
    monkeypatch.setattr(CapturePayment, "data_fields", "__all__")
    body = json.dumps({"amount": 5, "note": "x" * (70 * 1024)})
    problem(post_raw(client, "/payments/o1/capture/", body), 413, "stored_data_too_large")
    assert nothing_written()


@pytest.mark.parametrize("path", ["/orders/", "/django-orders/", "/payments/o1/capture/"])
@pytest.mark.parametrize("body", ['{"sku": "te\\u0000a", "amount": 5}',
                                  '{"sku": "tea", "amount": 5, "note": {"\\u0000": 1}}'],
                         ids=["value", "key"])
def test_a_nul_in_the_body_is_400_body_invalid_text(client, path, body):
    problem(post_raw(client, path, body), 400, "body_invalid_text")
    assert nothing_written()


@pytest.mark.parametrize("field", ["te\x00a", {"n": ["\x00"]}])
def test_phases_refuses_to_store_a_nul_however_it_is_called(field):
    from idempotency import IdempotentRequest, phases
    from idempotency.exceptions import RequestRefused

    request = IdempotentRequest(tenant_id=1, scope=CapturePayment.scope, key="direct",
                                fingerprint="f")
    with pytest.raises(RequestRefused) as refused:
        phases.execute(CapturePayment, request, data={"amount": field})
    assert (refused.value.status, refused.value.code) == (400, "body_invalid_text")
    assert nothing_written()


def test_a_program_reads_only_declared_fields_on_its_first_run_too(client, gateway, monkeypatch):
    monkeypatch.setattr(CapturePayment, "data_fields", ())
    response = post_raw(client, "/payments/o1/capture/", '{"amount": 5}')
    assert response.status_code == 400  # CaptureInput: amount is required; ctx.data is {}
    assert count_rows("testapp_payment") == 0


@pytest.mark.parametrize(
    "body, content_type, status",
    [('{"sku": ', "application/json", 400), ("sku=tea", "text/plain", 415)],
    ids=["malformed-json", "unsupported-media-type"],
)
def test_bodies_drf_cannot_parse_are_answered_before_the_key(client, body, content_type, status):
    assert post_raw(client, "/orders/", body, content_type=content_type).status_code == status
    assert nothing_written()
    corrected = post_raw(client, "/orders/", '{"sku": "tea"}')  # the same key, corrected
    assert corrected.status_code == 201


# --- "before anything is looked up": not one statement is sent --------------------------

TOO_DEEP = '{"sku": "tea", "extra": ' + nested(900) + "}"
FORM = "application/x-www-form-urlencoded"


@pytest.mark.parametrize("path", ["/orders/", "/django-orders/", "/payments/o1/capture/"])
@pytest.mark.parametrize("body, content_type, key, user, status, code", [
    ('{"sku": "tea"}', "application/json", None, "alice", 400, "idempotency_key_missing"),
    ('{"sku": "tea"}', "application/json", "", "alice", 400, "idempotency_key_invalid"),
    ('{"sku": "tea"}', "application/json", "k1", "nobody", 403, "tenant_unknown"),
    (json.dumps({"sku": "x" * (3 * 1024 * 1024)}), "application/json", "k1", "alice", 413,
     "body_too_large"),
    ("&".join(f"f{i}=x" for i in range(1001)), FORM, "k1", "alice", 413, "too_many_fields"),
    (TOO_DEEP, "application/json", "k1", "alice", 400, "body_too_deep"),
    ('{"sku": "\\ud800", "amount": 5}', "application/json", "k1", "alice", 400,
     "body_invalid_text"),
    ('{"sku": "te\\u0000a", "amount": 5}', "application/json", "k1", "alice", 400,
     "body_invalid_text"),
], ids=["no-key", "empty-key", "no-tenant", "too-large", "too-many-fields", "too-deep",
        "lone-surrogate", "nul"])
def test_bad_input_is_answered_before_any_statement_is_sent(client, path, body, content_type,
                                                            key, user, status, code):
    with statements_on_every_alias() as sent:
        problem(post_raw(client, path, body, key=key, content_type=content_type, user=user),
                status, code)
    assert sent == []


def test_a_nul_in_the_path_is_answered_before_any_statement_is_sent(client):
    with statements_on_every_alias() as sent:
        problem(post_raw(client, "/payments/a%00b/capture/", '{"amount": 5}'), 400,
                "path_invalid")
    assert sent == []
