"""Tenant isolation, enforced by PostgreSQL for the app role.

Every test here depends on the row-level security policies: the sensitivity
test (test_sensitivity.py) runs this module with the policies dropped and
requires every test to fail.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError

from idempotency.models import IdempotencyKey
from tenancy import tenant_context
from tests.helpers import app_atomic, app_connection, as_tenant, connect, raises_rls_violation
from tests.testapp.models import Order

A, B = 1, 2


@pytest.fixture
def orders():
    with tenant_context(A):
        a = Order.objects.create(tenant_id=A, sku="a-1")
    with tenant_context(B):
        b = Order.objects.create(tenant_id=B, sku="b-1")
    return a, b


def insert_key(cursor, tenant_id: int, key: str = "k") -> None:
    cursor.execute(
        "INSERT INTO idempotency_keys (tenant_id, scope, key, request_hash, request_method,"
        " request_path, state, status_code, expires_at)"
        " VALUES (%s, 's', %s, 'h', 'POST', '/', 'completed', 201, now() + interval '1 hour')",
        [tenant_id, key],
    )


def test_without_a_tenant_reads_see_nothing_orm(orders):
    with app_atomic():
        assert Order.objects.count() == 0
        assert IdempotencyKey.objects.count() == 0


def test_without_a_tenant_reads_see_nothing_raw_sql(orders):
    with connect() as conn:
        assert conn.execute("SELECT count(*) FROM testapp_order").fetchone()[0] == 0


def test_without_a_tenant_inserts_are_rejected():
    with connect() as conn, raises_rls_violation():
        insert_key(conn.cursor(), A)


def test_without_a_tenant_orm_inserts_are_rejected():
    with pytest.raises(Exception, match="row-level security"), app_atomic():
        Order.objects.create(tenant_id=A, sku="x")


def test_a_tenant_reads_only_its_own_rows_orm(orders):
    with tenant_context(A):
        assert list(Order.objects.values_list("sku", flat=True)) == ["a-1"]
    with tenant_context(B):
        assert list(Order.objects.values_list("sku", flat=True)) == ["b-1"]


def test_a_tenant_cannot_read_another_tenants_row_even_by_id(orders):
    _, b = orders
    with tenant_context(A):
        assert not Order.objects.filter(pk=b.pk).exists()
    with connect() as conn, as_tenant(conn, A) as cur:
        cur.execute("SELECT count(*) FROM testapp_order WHERE tenant_id = %s", [B])
        assert cur.fetchone()[0] == 0


def test_a_tenant_cannot_update_another_tenants_rows(orders):
    _, b = orders
    with tenant_context(A):
        assert Order.objects.filter(pk=b.pk).update(sku="stolen") == 0
    with connect() as conn, as_tenant(conn, A) as cur:
        cur.execute("UPDATE testapp_order SET sku = 'stolen' WHERE tenant_id = %s", [B])
        assert cur.rowcount == 0
    with tenant_context(B):
        assert Order.objects.get(pk=b.pk).sku == "b-1"


def test_a_tenant_cannot_move_its_row_to_another_tenant(orders):
    a, _ = orders
    with pytest.raises(Exception, match="row-level security"), tenant_context(A):
        Order.objects.filter(pk=a.pk).update(tenant_id=B)


def test_a_tenant_cannot_delete_another_tenants_rows(orders):
    _, b = orders
    with tenant_context(A):
        assert Order.objects.filter(pk=b.pk).delete()[0] == 0
    with connect() as conn, as_tenant(conn, A) as cur:
        cur.execute("DELETE FROM testapp_order")
        assert cur.rowcount == 1  # its own row only
    with tenant_context(B):
        assert Order.objects.filter(pk=b.pk).exists()


def test_a_tenant_cannot_insert_rows_for_another_tenant():
    with pytest.raises(Exception, match="row-level security"), tenant_context(A):
        Order.objects.create(tenant_id=B, sku="forged")
    with connect() as conn, raises_rls_violation(), as_tenant(conn, A) as cur:
        insert_key(cur, B)


def test_the_same_key_in_two_tenants_is_two_independent_rows():
    with connect() as conn:
        with as_tenant(conn, A) as cur:
            insert_key(cur, A, "same")
        with as_tenant(conn, B) as cur:
            insert_key(cur, B, "same")  # no conflict: the primary key leads with tenant_id
            cur.execute("DELETE FROM idempotency_keys WHERE key = 'same'")
            assert cur.rowcount == 1
        with as_tenant(conn, A) as cur:
            cur.execute("SELECT tenant_id FROM idempotency_keys WHERE key = 'same'")
            assert cur.fetchall() == [(A,)]


def test_the_tenant_does_not_leak_to_the_next_transaction_on_the_connection(orders):
    with tenant_context(A):
        assert Order.objects.count() == 1
    # Same Django connection, next transaction: fail closed again.
    with app_atomic():
        assert Order.objects.count() == 0
    with app_connection().cursor() as cursor:  # autocommit statement
        cursor.execute("SELECT count(*) FROM testapp_order")
        assert cursor.fetchone()[0] == 0


def test_leaving_a_nested_context_restores_the_outer_tenant(orders):
    with tenant_context(A):
        with tenant_context(B):
            assert list(Order.objects.values_list("sku", flat=True)) == ["b-1"]
        assert list(Order.objects.values_list("sku", flat=True)) == ["a-1"]


def test_a_nested_context_inside_a_plain_atomic_block_restores_no_tenant(orders):
    with app_atomic():
        with tenant_context(B):
            assert Order.objects.count() == 1
        assert Order.objects.count() == 0


def test_a_nested_context_that_fails_restores_the_outer_tenant(orders):
    with tenant_context(A):
        with pytest.raises(DatabaseError), tenant_context(B):
            with app_connection().cursor() as cursor:
                cursor.execute("SELECT 1/0")
        assert list(Order.objects.values_list("sku", flat=True)) == ["a-1"]
