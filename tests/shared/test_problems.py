"""One error format: DRF's errors and Django's, as problems, with the library's handlers.

``django_idempotency_outbox.drf.exception_handler`` is opt-in (the test
settings leave DRF's default); each test here opts in. The requests go to the
test app's views through Django's test client.
"""

from __future__ import annotations

import json

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import TooManyFieldsSent
from django.http import Http404
from django.test import RequestFactory, override_settings
from rest_framework.response import Response
from rest_framework.test import APIClient, APIRequestFactory
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from django_idempotency_outbox import problems
from tests.helpers import count_rows

HANDLER = "django_idempotency_outbox.drf.exception_handler"


@pytest.fixture(autouse=True)
def _problem_handler(settings):
    settings.REST_FRAMEWORK = {**django_settings.REST_FRAMEWORK, "EXCEPTION_HANDLER": HANDLER}


@pytest.fixture
def api():
    return APIClient()


def problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert body["type"] == "about:blank"
    assert body["status"] == status and body["code"] == code and body["detail"], body
    assert body["title"] == problems.reason_phrase(status)
    return body


def alice(**extra):
    return {"X-User": "alice", **extra}


def test_a_validation_error_keeps_the_fields_in_errors(api):
    response = api.post("/scoped-orders/", {"quantity": 0}, format="json", headers=alice())
    body = problem(response, 400, "invalid")
    assert body["detail"] == "Invalid input."
    assert set(body["errors"]) == {"sku", "quantity"}
    assert body["errors"]["quantity"] == ["Order at least one."]


def test_a_validation_error_under_a_key_is_stored_and_replayed_as_a_problem(api):
    headers = alice(**{"Idempotency-Key": "v1"})
    first = api.post("/orders/", {"quantity": 0}, format="json", headers=headers)
    again = api.post("/orders/", {"quantity": 0}, format="json", headers=headers)
    problem(first, 400, "invalid")
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert again["Content-Type"] == "application/problem+json"


def test_not_authenticated_and_authentication_failed(api):
    response = api.get("/scoped-orders/")
    problem(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == "X-User"
    problem(api.get("/scoped-orders/", headers={"X-User": "mallory"}), 401,
            "authentication_failed")


def test_permission_denied_raised_by_a_view(api):
    response = api.post("/scoped-orders/", {"sku": "tea", "then": "forbid"}, format="json",
                        headers=alice())
    problem(response, 403, "permission_denied")
    assert count_rows("testapp_order") == 0  # rolled back with the tenant's transaction


def test_not_found(api):
    problem(api.get("/scoped-orders/999/", headers=alice()), 404, "not_found")


def test_method_not_allowed_keeps_allow(api):
    response = api.delete("/scoped-orders/", headers=alice())
    problem(response, 405, "method_not_allowed")
    assert "POST" in response["Allow"]


def test_parse_error_and_unsupported_media_type(api):
    problem(api.post("/scoped-orders/", '{"sku": ', content_type="application/json",
                     headers=alice()), 400, "parse_error")
    problem(api.post("/scoped-orders/", "sku", content_type="text/plain", headers=alice()),
            415, "unsupported_media_type")


def test_not_acceptable(api):
    problem(api.get("/scoped-orders/", headers=alice(Accept="text/csv")), 406, "not_acceptable")


def test_too_many_form_fields_is_413(api):
    body = "&".join(f"f{i}=x" for i in range(1001))
    response = api.post("/scoped-orders/", body, content_type="application/x-www-form-urlencoded",
                        headers=alice())
    body = problem(response, 413, "too_many_fields")
    assert body["title"] == "Content Too Large"


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100)
def test_a_multipart_field_over_the_size_limit_is_413(api):
    response = api.post("/scoped-orders/", {"sku": "x" * 200}, format="multipart", headers=alice())
    problem(response, 413, "body_too_large")


class Refuse(BaseThrottle):
    def allow_request(self, request, view):
        return False

    def wait(self):
        return 7


class ThrottledView(APIView):
    throttle_classes = [Refuse]

    def get(self, request):
        return Response({})


def test_throttled_keeps_retry_after():
    request = APIRequestFactory().get("/throttled/", HTTP_X_USER="alice")
    response = ThrottledView.as_view()(request)
    problem(response, 429, "throttled")
    assert response["Retry-After"] == "7"


def test_other_exceptions_are_left_to_django():
    from django_idempotency_outbox.drf import exception_handler

    assert exception_handler(RuntimeError("boom"), {}) is None


# --- Django's own error views ---------------------------------------------------------------


def test_djangos_handlers_answer_problems():
    request = RequestFactory().get("/nowhere/")
    problem(problems.page_not_found(request, Http404()), 404, "not_found")
    problem(problems.bad_request(request, ValueError()), 400, "bad_request")
    problem(problems.bad_request(request, TooManyFieldsSent()), 413, "too_many_fields")
    problem(problems.permission_denied(request, PermissionError()), 403, "permission_denied")
    problem(problems.server_error(request), 500, "server_error")
