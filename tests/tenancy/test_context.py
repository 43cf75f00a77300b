"""tenant_context(): validation, transaction-local setting, nesting."""

from __future__ import annotations

import pytest

from tenancy import GUC, current_tenant_id, tenant_context, validate_tenant_id
from tests.helpers import app_atomic, app_connection

# make test-variants runs the tests marked `variants` again: those that send a statement
# through the library's aliases, which a deployment variant can change (docs/contributing.md).


def guc() -> str | None:
    with app_connection().cursor() as cursor:
        cursor.execute("SELECT current_setting(%s, true)", [GUC])
        return cursor.fetchone()[0]


@pytest.mark.parametrize("bad", [True, "1", 1.0, None, b"1"])
def test_tenant_ids_must_be_ints(bad):
    with pytest.raises(TypeError):
        validate_tenant_id(bad)


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1])
def test_tenant_ids_must_fit_bigint(bad):
    with pytest.raises(ValueError):
        validate_tenant_id(bad)


def test_a_bad_id_is_refused_before_any_transaction_starts():
    with pytest.raises(TypeError), tenant_context("1; DROP TABLE x"):  # type: ignore[arg-type]
        pass
    assert not app_connection().in_atomic_block


@pytest.mark.variants
def test_the_context_is_a_transaction_with_the_setting_local_to_it():
    assert not app_connection().in_atomic_block
    with tenant_context(7):
        assert app_connection().in_atomic_block
        assert guc() == "7"
        assert current_tenant_id() == 7
    assert current_tenant_id() is None
    assert guc() in (None, "")


@pytest.mark.variants
def test_nesting_restores_the_outer_value_and_then_nothing():
    with app_atomic():
        with tenant_context(1):
            with tenant_context(2):
                assert guc() == "2"
                with tenant_context(3):
                    assert current_tenant_id() == 3
                assert guc() == "2"
            assert guc() == "1"
            assert current_tenant_id() == 1
        assert guc() == ""
        assert current_tenant_id() is None


@pytest.mark.variants
def test_an_exception_in_a_nested_context_reverts_with_the_savepoint():
    with tenant_context(1):
        with pytest.raises(RuntimeError), tenant_context(2):
            raise RuntimeError
        assert guc() == "1"
        assert current_tenant_id() == 1
