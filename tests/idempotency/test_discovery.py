"""Phases programs are found at startup, in every process (docs/phases.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core import checks

from django_idempotency_outbox.errors import ConfigurationError
from idempotency import IdempotentRequest, Phases, phases
from idempotency.phases import completable_scopes, program_for
from tenancy.aliases import system_alias
from tests.helpers import count_rows, observer
from tests.live import ROOT


def abandon_a_delivery(key: str = "d1") -> None:
    """A delivery whose first run failed and whose client never came back."""
    from tests.testapp.phases import RecordDelivery as program  # here, whatever discovery did

    request = IdempotentRequest(tenant_id=1, scope="test.delivery", key=key,
                                fingerprint="f" * 64, method="POST", path="/deliveries/")
    result = phases.execute(program, request, data={"sku": "parcel", "fail_first": True})
    assert result.value.status_code == 503
    with observer() as conn:
        assert conn.execute("SELECT state FROM idempotency_keys").fetchone() == ("pending",)


def test_programs_of_every_apps_phases_module_are_registered_at_startup():
    assert "test.delivery" in completable_scopes()
    assert program_for("test.delivery").__module__ == "tests.testapp.phases"


def test_a_completer_in_a_fresh_process_finds_and_completes_the_program():
    abandon_a_delivery()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": os.environ.get(
        "DJANGO_SETTINGS_MODULE", "tests.settings")}
    done = subprocess.run(
        [sys.executable, "-m", "django", "complete_idempotency_keys", "--older-than", "0",
         "-v", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Found 1 abandoned keys: 1 completed, 0 failed again" in done.stdout
    assert "scope test.delivery key 'd1': completed with 201" in done.stdout
    assert count_rows("testapp_order") == 1
    with observer() as conn:
        assert conn.execute("SELECT state, status_code FROM idempotency_keys").fetchone() == (
            "completed", 201)


def test_two_programs_with_one_scope_are_an_error():
    with pytest.raises(ConfigurationError, match="both have scope 'test.delivery'"):

        class AnotherDelivery(Phases):
            scope = "test.delivery"

    assert program_for("test.delivery").__name__ == "RecordDelivery"


def test_a_subclass_that_keeps_its_parents_scope_does_not_replace_it():
    parent = program_for("test.delivery")

    class Tweaked(parent):  # type: ignore[misc, valid-type]
        pass

    assert program_for("test.delivery") is parent


def test_a_scope_with_pending_keys_and_no_program_is_reported():
    abandon_a_delivery()
    with observer() as conn:  # as a deploy that renamed the program would leave it
        conn.execute("UPDATE idempotency_keys SET scope = 'delivery.renamed'")
    warnings = [m for m in checks.run_checks(databases=[system_alias()])
                if m.id == "idempotency.W001"]
    assert [m.msg.split("'")[1] for m in warnings] == ["delivery.renamed"]
    with observer() as conn:
        conn.execute("UPDATE idempotency_keys SET scope = 'test.delivery'")
    assert not [m for m in checks.run_checks(databases=[system_alias()])
                if m.id == "idempotency.W001"]
    assert not [m for m in checks.run_checks() if m.id == "idempotency.W001"]  # needs --database
