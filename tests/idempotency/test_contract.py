"""Every row of the contract table (docs/mixin.md), through the DRF mixin."""

from __future__ import annotations

import json

import pytest

from tests.helpers import app_connection, count_rows, observer

# make test-variants runs the tests marked `variants` again: those that send a statement
# through the library's aliases, which a deployment variant can change (docs/contributing.md).


def orders(where: str = "TRUE") -> int:
    return count_rows("testapp_order", where)


def stored_keys() -> list[tuple]:
    with observer() as conn:
        return conn.execute(
            "SELECT tenant_id, scope, key, state, status_code FROM idempotency_keys ORDER BY 1, 3"
        ).fetchall()


def problem(response) -> dict:
    assert response["Content-Type"] == "application/problem+json"
    return json.loads(response.content)


# --- safe methods and the header ------------------------------------------------


# In the variants, with a key only: a safe method's key is never read (idempotency.flow.respond),
# so both cases send the same statements.
@pytest.mark.parametrize("key", [
    pytest.param(None, id="without-a-key"),
    pytest.param("k1", id="with-a-key", marks=pytest.mark.variants),
])
def test_safe_methods_need_no_key_run_as_the_tenant_and_store_nothing(client, key):
    assert client.order(key="first").status_code == 201  # alice's order, tenant 1
    assert client.order(key="first", user="bob").status_code == 201  # bob's, tenant 2
    headers = {"X-User": "alice", **({"Idempotency-Key": key} if key else {})}
    listed = client.get("/order-book/", headers=headers)
    assert listed.status_code == 200, listed.content
    assert [order["sku"] for order in listed.json()] == ["tea"]  # tenant 1's only
    assert "Idempotent-Replayed" not in listed
    assert client.head("/order-book/", headers=headers).status_code == 200
    assert client.options("/order-book/", headers=headers).status_code == 200
    assert [row[2] for row in stored_keys()] == ["first", "first"]  # the two POSTs' only


def test_a_missing_key_is_400_problem_json(client):
    response = client.order(key=None)
    assert response.status_code == 400
    assert problem(response)["code"] == "idempotency_key_missing"
    assert orders() == 0


@pytest.mark.variants
def test_a_missing_key_is_allowed_where_the_view_says_so(client):
    response = client.order(key=None, path="/orders-optional/")
    assert response.status_code == 201
    assert orders() == 1
    assert stored_keys() == []


@pytest.mark.parametrize(
    "header",
    ["", '""', "x" * 256, '"' + "x" * 256 + '"', "caf\u00e9", '"unterminated', '"a"b"', '"bad\\n"'],
    ids=[
        "empty",
        "empty-sf",
        "256",
        "256-sf",
        "non-ascii",
        "unterminated",
        "stray-quote",
        "escape",
    ],
)
def test_invalid_keys_are_400(client, header):
    response = client.order(key=header)
    assert response.status_code == 400, response.content
    assert problem(response)["code"] == "idempotency_key_invalid"
    assert orders() == 0
    assert stored_keys() == []


@pytest.mark.variants
def test_a_255_character_key_is_accepted(client):
    assert client.order(key="k" * 255).status_code == 201
    assert stored_keys()[0][2] == "k" * 255


@pytest.mark.variants
def test_bare_and_quoted_keys_name_the_same_key(client):
    first = client.order(key="abc")
    again = client.order(key='"abc"')
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert orders() == 1


@pytest.mark.variants
def test_quoted_keys_unescape(client):
    assert client.order(key='"a\\"b\\\\c"').status_code == 201
    assert stored_keys()[0][2] == 'a"b\\c'


# --- first request and replay ---------------------------------------------------


@pytest.mark.variants
def test_the_first_request_runs_once_and_is_stored(client):
    response = client.order(key="k1")
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response
    assert orders() == 1
    assert stored_keys() == [(1, "order.create", "k1", "completed", 201)]


@pytest.mark.variants
def test_a_retry_replays_status_body_location_and_content_type(client):
    first = client.order(key="k1")
    again = client.order(key="k1")
    assert again.status_code == first.status_code == 201
    assert again.content == first.content
    assert again["Location"] == first["Location"]
    assert again["Content-Type"] == first["Content-Type"] == "application/json"
    assert again["Idempotent-Replayed"] == "true"
    assert "X-Not-Replayed" not in again  # only the chosen headers are stored
    assert orders() == 1


@pytest.mark.variants
def test_a_replay_is_answered_from_the_key_even_if_the_handler_would_now_fail(client):
    client.order(key="k1")
    # Same request again: the handler is not run (it would create a second order).
    for _ in range(3):
        assert client.order(key="k1")["Idempotent-Replayed"] == "true"
    assert orders() == 1


@pytest.mark.variants
def test_keys_are_scoped_per_tenant(client):
    assert client.order(key="k1", user="alice").status_code == 201
    response = client.order(key="k1", user="bob")
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response
    assert orders() == 2
    assert [row[0] for row in stored_keys()] == [1, 2]


@pytest.mark.variants
def test_keys_are_scoped_per_operation(client):
    assert client.order(key="k1").status_code == 201  # scope order.create
    other = client.order(key="k1", path="/orders-short/", data={"sku": "coffee"})
    assert other.status_code == 201 and "Idempotent-Replayed" not in other  # another scope
    assert orders() == 2
    assert [(row[1], row[2]) for row in stored_keys()] == [
        ("order.create", "k1"), ("order.create-short", "k1")]
    assert client.order(key="k1")["Idempotent-Replayed"] == "true"


@pytest.mark.variants
def test_the_default_scope_is_module_view_class_and_action(client):
    assert client.order(key="k1", path="/orders-default-scope/").status_code == 201
    assert [row[1] for row in stored_keys()] == [
        "tests.testapp.views.DefaultScopeOrderViewSet.create"]


# --- the scope, principal and fingerprint hooks (docs/mixin.md's examples) --------------


def hooked(client, key="k1", user="alice", version="1", client_id="c1",
           path="/orders-hooked-identity/", **data):
    return client.post(path, {"sku": "tea", "quantity": 1, **data},
                       format="json", headers={
                           "X-User": user, "Idempotency-Key": key, "X-Api-Version": version,
                           "X-Client": client_id})


@pytest.mark.variants
def test_the_scope_hook_names_the_operation_keys_are_unique_in(client):
    assert hooked(client, version="1").status_code == 201
    assert hooked(client, version="2").status_code == 201  # another scope: another request
    assert hooked(client, version="1")["Idempotent-Replayed"] == "true"
    assert [row[1] for row in stored_keys()] == ["order.create.v1", "order.create.v2"]
    assert orders() == 2


@pytest.mark.variants
def test_the_principal_hook_decides_who_is_asking(client):
    assert hooked(client, user="alice", client_id="c1").status_code == 201
    # Another user of the tenant through the same API client: the same principal.
    assert hooked(client, user="amy", client_id="c1")["Idempotent-Replayed"] == "true"
    # Another client with the key: another principal, a different request.
    assert hooked(client, user="alice", client_id="c2").status_code == 422
    assert orders() == 1


@pytest.mark.variants
def test_the_fingerprint_hook_decides_what_makes_the_same_request(client):
    path = "/orders-hooked-fingerprint/"
    assert hooked(client, path=path, sent_at="10:00:00").status_code == 201
    assert hooked(client, path=path, sent_at="10:00:05")["Idempotent-Replayed"] == "true"
    assert hooked(client, path=path, sent_at="10:00:09", quantity=2).status_code == 422
    assert orders() == 1


def test_a_user_without_tenant_is_refused(client):
    response = client.order(key="k1", user="nobody")
    assert response.status_code == 403
    assert problem(response)["code"] == "tenant_unknown"


# --- mismatches -------------------------------------------------------------------


def assert_mismatch_keeps_original(client, first, response):
    assert response.status_code == 422
    assert problem(response)["code"] == "idempotency_key_reused"
    assert orders() == 1
    again = client.order(key="k1")
    assert again.status_code == 201 and again.content == first.content
    assert again["Idempotent-Replayed"] == "true"


@pytest.mark.variants
def test_same_key_different_body_is_422_and_the_original_is_kept(client):
    first = client.order(key="k1")
    response = client.order(key="k1", data={"sku": "coffee", "quantity": 1})
    assert_mismatch_keeps_original(client, first, response)


@pytest.mark.variants
def test_same_key_different_path_is_422(client):
    first = client.order(key="k1")
    response = client.order(key="k1", path="/v2/orders/")
    assert_mismatch_keeps_original(client, first, response)


@pytest.mark.variants
def test_same_key_different_user_of_the_same_tenant_is_422(client):
    first = client.order(key="k1", user="alice")
    response = client.order(key="k1", user="amy")
    assert_mismatch_keeps_original(client, first, response)


@pytest.mark.variants
def test_same_key_different_method_is_422(client):
    first = client.order(key="k1", path="/orders-write/", data={"sku": "tea"})
    response = client.order(key="k1", path="/orders-write/", data={"sku": "tea"}, method="put")
    assert response.status_code == 422
    again = client.order(key="k1", path="/orders-write/", data={"sku": "tea"})
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert orders() == 1


@pytest.mark.variants
def test_key_order_and_whitespace_in_json_do_not_matter(client):
    client.post(
        "/orders/",
        data='{"sku": "tea",   "quantity": 1}',
        content_type="application/json",
        headers={"X-User": "alice", "Idempotency-Key": "k1"},
    )
    again = client.post(
        "/orders/",
        data='{"quantity":1,"sku":"tea"}',
        content_type="application/json",
        headers={"X-User": "alice", "Idempotency-Key": "k1"},
    )
    assert again["Idempotent-Replayed"] == "true"


# In the variants, urlencoded only: the fingerprint is computed before any statement, and
# both forms then meet the stored JSON request's row with the same statements.
@pytest.mark.parametrize("form", [pytest.param("urlencoded", marks=pytest.mark.variants),
                                  "multipart"])
def test_the_same_fields_form_encoded_are_another_request_than_json(client, form):
    """docs/mixin.md: a form's values are lists of strings, JSON's are typed values."""
    first = client.order(key="k1", data={"sku": "tea", "quantity": 1})
    if form == "multipart":
        response = client.order(key="k1", data={"sku": "tea", "quantity": "1"},
                                format="multipart")
    else:
        response = client.post("/orders/", data="sku=tea&quantity=1",
                               content_type="application/x-www-form-urlencoded",
                               headers={"X-User": "alice", "Idempotency-Key": "k1"})
    assert_mismatch_keeps_original(client, first, response)


@pytest.mark.variants
def test_a_form_encoded_retry_of_a_form_encoded_request_replays(client):
    def send():
        return client.post("/orders/", data="quantity=1&sku=tea",
                           content_type="application/x-www-form-urlencoded",
                           headers={"X-User": "alice", "Idempotency-Key": "k1"})

    assert send().status_code == 201
    assert send()["Idempotent-Replayed"] == "true"
    assert orders() == 1


@pytest.mark.variants
def test_the_422_problem_is_titled_unprocessable_content_on_this_python(client):
    """RFC 9110's name, which Python's http.HTTPStatus has only from 3.13 on."""
    client.order(key="k1")
    response = client.order(key="k1", data={"sku": "coffee", "quantity": 1})
    assert problem(response)["title"] == "Unprocessable Content"
    assert response.reason_phrase == "Unprocessable Content"


# --- bad bodies and uploads -------------------------------------------------------


@pytest.mark.variants
def test_a_malformed_json_body_is_400_and_not_recorded(client):
    response = client.post(
        "/orders/",
        data='{"sku": ',
        content_type="application/json",
        headers={"X-User": "alice", "Idempotency-Key": "k1"},
    )
    assert response.status_code == 400
    assert stored_keys() == []
    assert client.order(key="k1").status_code == 201  # the corrected retry runs


def upload(client, content: bytes, key="u1", sku="doc"):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return client.post(
        "/uploads/",
        {"sku": sku, "file": SimpleUploadedFile("a.txt", content)},
        format="multipart",
        headers={"X-User": "alice", "Idempotency-Key": key},
    )


@pytest.mark.variants
def test_multipart_uploads_are_fingerprinted_by_file_digest(client):
    first = upload(client, b"hello")
    assert first.status_code == 201, first.content
    assert first.json()["sha256"].startswith("2cf24dba")  # the handler read the whole file
    same = upload(client, b"hello")
    assert same["Idempotent-Replayed"] == "true"
    other = upload(client, b"hellO")
    assert other.status_code == 422
    assert orders() == 1


# --- failures -----------------------------------------------------------------------


@pytest.mark.variants
def test_a_handler_that_writes_then_raises_leaves_nothing_and_the_retry_runs(client):
    client.raise_request_exception = False
    response = client.order(key="k1", data={"sku": "tea", "quantity": 1, "then": "raise"})
    assert response.status_code == 500
    assert orders() == 0
    assert stored_keys() == []
    retry = client.order(key="k1")
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry
    assert orders() == 1


@pytest.mark.variants
def test_a_5xx_answer_is_not_stored_and_its_writes_roll_back(client):
    response = client.order(key="k1", data={"sku": "x", "then": "unavailable"})
    assert response.status_code == 503
    assert orders() == 0 and stored_keys() == []


@pytest.mark.variants
def test_a_final_4xx_is_stored_as_failed_replayed_and_its_writes_roll_back(client):
    response = client.order(key="k1", data={"sku": "tea", "quantity": 1, "then": "decline"})
    assert response.status_code == 402
    assert orders() == 0
    assert stored_keys() == [(1, "order.create", "k1", "failed", 402)]
    again = client.order(key="k1", data={"sku": "tea", "quantity": 1, "then": "decline"})
    assert again.status_code == 402 and again.content == response.content
    assert again["Idempotent-Replayed"] == "true"


@pytest.mark.variants
def test_a_validation_error_is_a_final_4xx(client):
    response = client.order(key="k1", data={"sku": "tea", "quantity": 0})
    assert response.status_code == 400
    assert stored_keys() == [(1, "order.create", "k1", "failed", 400)]
    assert (
        client.order(key="k1", data={"sku": "tea", "quantity": 0})["Idempotent-Replayed"] == "true"
    )


@pytest.fixture
def answering():
    """The view at /answering/: writes an order, publishes order.placed, then answers
    the body's ``answer``; returns the keys the handler ran for."""
    from tests.testapp.views import AnsweringView

    AnsweringView.calls.clear()
    yield AnsweringView.calls
    AnsweringView.calls.clear()


def answer(client, answer, key="k1"):
    return client.order(key=key, path="/answering/", data={"sku": "tea", "answer": answer})


# In the variants, 409 only: classify() makes each of these statuses UNSTORED before any
# statement depends on it, so every case sends the same statements through the alias.
@pytest.mark.parametrize("status", [
    pytest.param(status, marks=pytest.mark.variants) if status == 409 else status
    for status in [401, 403, 404, 408, 409, 425, 429]
])
def test_the_unstored_statuses_are_not_stored(client, settings, answering, status):
    settings.IDEMPOTENCY = {}  # the default UNSTORED_STATUS_CODES
    assert answer(client, status).status_code == status
    assert stored_keys() == [] and orders() == 0  # the handler's writes rolled back
    assert count_rows("outbox_messages") == 0
    retried = answer(client, status)
    assert retried.status_code == status and "Idempotent-Replayed" not in retried
    assert answering == ["k1", "k1"]  # the retry ran the handler again


def test_unauthenticated_requests_are_401_before_the_key_is_looked_at(client):
    response = client.order(key="k1", user=None)
    assert response.status_code == 401
    assert stored_keys() == []


# In the variants, the permission only: DRF refuses in initial(), before the view and the key,
# for both; what follows sends the same statements.
@pytest.mark.parametrize("path, status", [
    pytest.param("/orders-refused/", 403, id="permission", marks=pytest.mark.variants),
    pytest.param("/orders-throttled/", 429, id="throttle"),
])
def test_drfs_refusals_come_before_the_key_and_leave_it_unused(client, settings, path, status):
    # Nothing unstored: a refusal that came after the key would be stored as failed.
    settings.IDEMPOTENCY = {"UNSTORED_STATUS_CODES": ()}
    refused = client.order(key="k1", path=path)
    assert refused.status_code == status, refused.content
    assert stored_keys() == [] and orders() == 0  # the view did not run; no key row
    fresh = client.order(key="k1")  # the same scope (order.create) and key, allowed
    assert fresh.status_code == 201 and "Idempotent-Replayed" not in fresh


# --- the view's outbox events commit with the key ---------------------------------------


def messages() -> int:
    return count_rows("outbox_messages", "topic = 'order.placed'")


@pytest.mark.variants
def test_the_views_event_commits_with_its_answer_and_a_replay_publishes_nothing(
        client, answering):
    assert answer(client, 201).status_code == 201
    assert messages() == 1 and orders() == 1
    assert answer(client, 201)["Idempotent-Replayed"] == "true"
    assert messages() == 1 and answering == ["k1"]


@pytest.mark.variants
def test_a_final_4xx_keeps_no_event_nor_does_its_replay(client, answering):
    assert answer(client, "decline").status_code == 402
    assert stored_keys() == [(1, "order.answer", "k1", "failed", 402)]
    assert messages() == 0 and orders() == 0  # its writes, the event included, rolled back
    assert answer(client, "decline")["Idempotent-Replayed"] == "true"
    assert messages() == 0 and answering == ["k1"]


# In the variants, raise and 500: 503 takes 500's branch (classify(): 5xx) with the same
# statements.
@pytest.mark.parametrize("outcome", [pytest.param("raise", marks=pytest.mark.variants),
                                     pytest.param(500, marks=pytest.mark.variants), 503])
def test_a_5xx_keeps_no_event_and_the_retry_publishes_once(client, answering, outcome):
    client.raise_request_exception = False
    assert answer(client, outcome).status_code == (500 if outcome == "raise" else outcome)
    assert messages() == 0 and orders() == 0 and stored_keys() == []
    assert answer(client, 201).status_code == 201  # the retry runs: one order, one event
    assert messages() == 1 and orders() == 1


# --- expiry -------------------------------------------------------------------------


def expire_all():
    with observer() as conn:
        conn.execute("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'")


@pytest.mark.variants
def test_an_expired_but_unreaped_key_is_treated_as_new(client):
    client.order(key="k1")
    expire_all()
    response = client.order(key="k1", data={"sku": "coffee", "quantity": 2})
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response
    assert orders() == 2
    with observer() as conn:
        (expires_in,) = conn.execute(
            "SELECT expires_at - now() > interval '23 hours' FROM idempotency_keys"
        ).fetchone()
    assert expires_in


@pytest.mark.variants
def test_the_ttl_is_per_view_and_set_by_the_database_clock(client):
    client.order(key="k1", path="/orders-short/")
    with observer() as conn:
        (ttl,) = conn.execute("SELECT expires_at - created_at FROM idempotency_keys").fetchone()
    assert ttl.total_seconds() == pytest.approx(1, abs=0.5)


@pytest.mark.variants
def test_the_ttl_setting_applies_to_views_without_their_own(client, settings):
    settings.IDEMPOTENCY = {"TTL": 3600}
    client.order(key="k1")
    with observer() as conn:
        (ttl,) = conn.execute("SELECT expires_at - created_at FROM idempotency_keys").fetchone()
    assert ttl.total_seconds() == pytest.approx(3600, abs=1)


# --- settings for status codes -------------------------------------------------------


@pytest.mark.variants
def test_status_codes_are_settings(client, settings):
    settings.IDEMPOTENCY = {"STATUS_MISMATCH": 409}
    assert client.order(key=None).status_code == 400  # the draft's, not a setting
    client.order(key="k1")
    assert client.order(key="k1", data={"sku": "other"}).status_code == 409


# --- ATOMIC_REQUESTS ----------------------------------------------------------------


@pytest.fixture
def atomic_requests():
    app_connection().settings_dict["ATOMIC_REQUESTS"] = True
    yield
    app_connection().settings_dict["ATOMIC_REQUESTS"] = False


@pytest.mark.variants
def test_under_atomic_requests_the_contract_holds(client, atomic_requests):
    client.raise_request_exception = False
    assert client.order(key="k1").status_code == 201
    assert client.order(key="k1")["Idempotent-Replayed"] == "true"
    assert client.order(key="k2", data={"sku": "t", "then": "raise"}).status_code == 500
    declined = client.order(key="k3", data={"sku": "t", "quantity": 1, "then": "decline"})
    assert declined.status_code == 402
    assert (
        client.order(key="k3", data={"sku": "t", "quantity": 1, "then": "decline"}).content
        == declined.content
    )
    assert orders() == 1
    assert [(row[2], row[3]) for row in stored_keys()] == [("k1", "completed"), ("k3", "failed")]


# --- fingerprint details, hooks and the remaining settings ---------------------------


@pytest.mark.variants
def test_query_parameters_count_in_any_order(client):
    assert client.order(key="k1", path="/orders/?b=2&a=1").status_code == 201
    assert client.order(key="k1", path="/orders/?a=1&b=2")["Idempotent-Replayed"] == "true"
    assert client.order(key="k1", path="/orders/?a=2&b=2").status_code == 422


@pytest.mark.variants
def test_the_key_and_replay_hooks(client):
    refused = client.order(key="plain", path="/orders-hooked/")
    assert refused.status_code == 400 and "ord_" in problem(refused)["detail"]
    assert client.order(key="ord_1", path="/orders-hooked/").status_code == 201
    replay = client.order(key="ord_1", path="/orders-hooked/")
    assert replay["Idempotent-Replayed"] == "true" and replay["X-Replay-Count"] == "counted"


@pytest.mark.variants
def test_replayed_headers_are_a_setting_and_a_key_is_at_most_255_characters(client, settings):
    settings.IDEMPOTENCY = {"REPLAYED_HEADERS": ("Content-Type", "X-Not-Replayed")}
    assert client.order(key="k" * 256).status_code == 400
    client.order(key="k" * 255)
    replay = client.order(key="k" * 255)
    assert replay["X-Not-Replayed"] == "1" and "Location" not in replay


def test_the_in_progress_status_is_a_setting_and_retry_after_one_second(settings):
    from idempotency.core import Outcome, Result
    from idempotency.responses import answer

    settings.IDEMPOTENCY = {"STATUS_IN_PROGRESS": 425}
    response = answer(Result(Outcome.IN_PROGRESS))
    assert response.status_code == 425 and response["Retry-After"] == "1"
