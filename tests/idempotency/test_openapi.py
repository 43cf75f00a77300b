"""The drf-spectacular extension: the schema says what the library answers, from the settings.

Schemas are generated from the test app's URLconf, as drf-spectacular's
``SchemaGenerator`` generates them for ``manage.py spectacular``.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from django.conf import settings as django_settings
from django.test import override_settings
from django.urls import path
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency import IdempotentViewMixin
from idempotency.core import key_pattern
from tests.live import ROOT

HANDLER = "django_idempotency_outbox.drf.exception_handler"


def rest_framework(**extra):
    return {
        **django_settings.REST_FRAMEWORK,
        "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
        **extra,
    }


def schema(patterns=None, **rest) -> dict:
    with override_settings(REST_FRAMEWORK=rest_framework(**rest)):
        return SchemaGenerator(patterns=patterns).get_schema(request=None, public=True)


def operation(generated: dict, route: str, method: str) -> dict:
    return generated["paths"][route][method]


def key_header(op: dict) -> dict:
    (header,) = [p for p in op.get("parameters", []) if p["in"] == "header"]
    return header


def codes(op: dict, status: int) -> str:
    return op["responses"][str(status)]["description"]


def test_unsafe_methods_document_the_key_header_exactly():
    op = operation(schema(), "/orders/", "post")
    header = key_header(op)
    assert header["name"] == "Idempotency-Key"
    assert header["required"] is True
    assert header["schema"]["pattern"] == key_pattern(255)
    assert header["schema"]["maxLength"] == 2 * 255 + 2
    pattern = re.compile(header["schema"]["pattern"])
    assert pattern.match('"8e03978e-40d5"') and pattern.match("abc")
    assert not pattern.match("k1,k2") and not pattern.match('"a", "b"')


def test_safe_methods_have_no_key_header():
    op = operation(schema(), "/order-book/", "get")
    assert [p for p in op.get("parameters", []) if p["in"] == "header"] == []
    assert "Idempotent-Replayed" not in str(op["responses"])


def test_whether_the_key_is_required_follows_the_view_and_the_setting():
    assert key_header(operation(schema(), "/orders-optional/", "post"))["required"] is False
    with override_settings(IDEMPOTENCY={"REQUIRED": False}):
        generated = schema()
    assert key_header(operation(generated, "/orders/", "post"))["required"] is False
    # A phases program cannot run without a key, whatever the setting says.
    capture = operation(generated, "/payments/{order}/capture/", "post")
    assert key_header(capture)["required"] is True
    assert "idempotency_key_missing" in codes(capture, 400)


def test_every_library_answer_is_a_problem_with_its_code():
    generated = schema()
    op = operation(generated, "/orders/", "post")
    expected = {
        400: ["idempotency_key_missing", "idempotency_key_invalid", "body_too_deep",
              "body_invalid_text", "path_invalid"],
        403: ["tenant_unknown"],
        409: ["idempotency_key_in_progress"],
        413: ["body_too_large", "too_many_fields", "too_many_files"],
        422: ["idempotency_key_reused"],
    }
    ref = {"$ref": "#/components/schemas/Problem"}
    for status, names in expected.items():
        response = op["responses"][str(status)]
        assert response["content"]["application/problem+json"]["schema"] == ref
        for name in names:
            assert f"`{name}`" in response["description"], (status, name)
    assert "Retry-After" in op["responses"]["409"]["headers"]
    assert "stored_data_too_large" not in codes(op, 413)
    capture = operation(generated, "/payments/{order}/capture/", "post")
    assert "stored_data_too_large" in codes(capture, 413)
    problem = generated["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"type", "title", "status", "detail", "code"}


def test_the_replay_header_is_on_the_views_own_stored_answers():
    op = operation(schema(), "/orders/", "post")
    assert set(op["responses"]["201"]["headers"]) == {"Idempotent-Replayed"}
    for status in ("400", "403", "409", "413", "422"):
        assert "Idempotent-Replayed" not in op["responses"][status].get("headers", {})


@override_settings(
    IDEMPOTENCY={"STATUS_MISMATCH": 409, "STATUS_IN_PROGRESS": 425},
    TENANCY={**django_settings.TENANCY, "STATUS_NO_TENANT": 404},
)
def test_statuses_come_from_the_settings_and_the_key_from_the_draft():
    op = operation(schema(), "/orders/", "post")
    header = key_header(op)
    assert header["name"] == "Idempotency-Key"
    assert header["schema"]["pattern"] == key_pattern() and "{1,255}" in key_pattern()
    assert header["schema"]["maxLength"] == 512
    assert "idempotency_key_reused" in codes(op, 409)
    assert "idempotency_key_in_progress" in codes(op, 425)
    assert "Retry-After" in op["responses"]["425"]["headers"]
    assert "idempotency_key_missing" in codes(op, 400)
    assert "idempotency_key_invalid" in codes(op, 400)
    assert "tenant_unknown" in codes(op, 404)
    assert "422" not in op["responses"] and "403" not in op["responses"]


def test_tenant_scoped_views_document_the_no_tenant_answer():
    generated = schema()
    assert "tenant_unknown" in codes(operation(generated, "/scoped-orders/", "get"), 403)
    assert "tenant_unknown" in codes(operation(generated, "/scoped-orders/{id}/", "get"), 403)
    opted_out = operation(generated, "/unscoped-status/", "get")
    assert "403" not in opted_out["responses"]
    # Opted out on its safe methods only: keys belong to a tenant.
    assert "403" not in operation(generated, "/opted-out-order-book/", "get")["responses"]
    assert "tenant_unknown" in codes(operation(generated, "/opted-out-order-book/", "post"), 403)


def test_drfs_answers_are_documented_only_with_the_librarys_exception_handler():
    without = operation(schema(), "/orders/", "post")
    assert not {"401", "406", "415"} & set(without["responses"])
    op = operation(schema(EXCEPTION_HANDLER=HANDLER), "/orders/", "post")
    assert "not_authenticated" in codes(op, 401)
    assert "WWW-Authenticate" in op["responses"]["401"]["headers"]
    assert "parse_error" in codes(op, 400) and "`invalid`" in codes(op, 400)
    assert "unsupported_media_type" in codes(op, 415)
    assert "not_acceptable" in codes(op, 406)
    # A validation error of the view's is stored and replayed.
    assert "Idempotent-Replayed" in op["responses"]["400"]["headers"]
    detail = operation(schema(EXCEPTION_HANDLER=HANDLER), "/scoped-orders/{id}/", "get")
    assert "not_found" in codes(detail, 404)


class Receipt(serializers.Serializer):
    id = serializers.IntegerField()


def annotated_view() -> type:
    """A view whose method carries ``@extend_schema`` (built once the schema class is set)."""

    class AnnotatedView(IdempotentViewMixin, APIView):
        idempotency_scope = "receipt.create"

        @extend_schema(request=None, responses={201: Receipt, 402: None},
                       operation_id="make_receipt")
        def post(self, request):
            return Response({"id": 1}, status=201)

    return AnnotatedView


def test_extend_schema_on_a_method_and_the_extension_both_apply():
    with override_settings(REST_FRAMEWORK=rest_framework()):
        view = annotated_view()
    op = operation(schema([path("receipts/", view.as_view())]), "/receipts/", "post")
    assert op["operationId"] == "make_receipt"
    assert op["responses"]["201"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Receipt"
    }
    assert key_header(op)["name"] == "Idempotency-Key"
    assert {"201", "400", "402", "403", "409", "413", "422"} <= set(op["responses"])
    assert "Idempotent-Replayed" in op["responses"]["402"]["headers"]


@pytest.mark.parametrize("module", ["idempotency", "tenancy"])
def test_the_library_works_without_drf_spectacular(module):
    code = (
        "import sys; sys.modules['drf_spectacular'] = None\n"
        "import django; django.setup()\n"
        "from idempotency import IdempotentViewMixin\n"
        "from tenancy import TenantScopedViewMixin\n"
        f"assert '{module}.openapi' not in sys.modules\n"
        "print('imported without drf-spectacular')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "imported without drf-spectacular" in done.stdout
