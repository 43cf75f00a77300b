"""Tenant isolation, enforced by PostgreSQL for the app role.

Every test here depends on the row-level security policies: the sensitivity
test (test_sensitivity.py) runs this module with the policies dropped and
requires every test to fail.
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import DatabaseError

from idempotency.models import IdempotencyKey
from tenancy import tenant_context
from tests.helpers import (
    app_atomic,
    app_connection,
    as_tenant,
    connect,
    observer,
    raises_rls_violation,
)
from tests.testapp.factories import OrderFactory
from tests.testapp.models import Order

# make test-variants runs the tests marked `variants` again: those that send a statement
# through the library's aliases, which a deployment variant can change (docs/contributing.md).

A, B = 1, 2


@pytest.fixture
def orders():
    with tenant_context(A):
        a = OrderFactory(sku="a-1")
    with tenant_context(B):
        b = OrderFactory(sku="b-1")
    return a, b


def insert_key(cursor, tenant_id: int, key: str = "k") -> None:
    cursor.execute(
        "INSERT INTO idempotency_keys (tenant_id, scope, key, request_hash, request_method,"
        " request_path, state, status_code, expires_at)"
        " VALUES (%s, 's', %s, 'h', 'POST', '/', 'completed', 201, now() + interval '1 hour')",
        [tenant_id, key],
    )


@pytest.mark.variants
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


@pytest.mark.variants
def test_without_a_tenant_orm_inserts_are_rejected():
    with pytest.raises(Exception, match="row-level security"), app_atomic():
        Order.objects.create(tenant_id=A, sku="x")


@pytest.mark.variants
def test_a_tenant_reads_only_its_own_rows_orm(orders):
    with tenant_context(A):
        assert list(Order.objects.values_list("sku", flat=True)) == ["a-1"]
    with tenant_context(B):
        assert list(Order.objects.values_list("sku", flat=True)) == ["b-1"]


@pytest.mark.variants
def test_a_tenant_cannot_read_another_tenants_row_even_by_id(orders):
    _, b = orders
    with tenant_context(A):
        assert not Order.objects.filter(pk=b.pk).exists()
    with connect() as conn, as_tenant(conn, A) as cur:
        cur.execute("SELECT count(*) FROM testapp_order WHERE tenant_id = %s", [B])
        assert cur.fetchone()[0] == 0


@pytest.mark.variants
def test_a_tenant_cannot_update_another_tenants_rows(orders):
    _, b = orders
    with tenant_context(A):
        assert Order.objects.filter(pk=b.pk).update(sku="stolen") == 0
    with connect() as conn, as_tenant(conn, A) as cur:
        cur.execute("UPDATE testapp_order SET sku = 'stolen' WHERE tenant_id = %s", [B])
        assert cur.rowcount == 0
    with tenant_context(B):
        assert Order.objects.get(pk=b.pk).sku == "b-1"


@pytest.mark.variants
def test_a_tenant_cannot_move_its_row_to_another_tenant(orders):
    a, _ = orders
    with pytest.raises(Exception, match="row-level security"), tenant_context(A):
        Order.objects.filter(pk=a.pk).update(tenant_id=B)


@pytest.mark.variants
def test_a_tenant_cannot_delete_another_tenants_rows(orders):
    _, b = orders
    with tenant_context(A):
        assert Order.objects.filter(pk=b.pk).delete()[0] == 0
    with connect() as conn, as_tenant(conn, A) as cur:
        cur.execute("DELETE FROM testapp_order")
        assert cur.rowcount == 1  # its own row only
    with tenant_context(B):
        assert Order.objects.filter(pk=b.pk).exists()


@pytest.mark.variants
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


@pytest.mark.variants
def test_the_tenant_does_not_leak_to_the_next_transaction_on_the_connection(orders):
    with tenant_context(A):
        assert Order.objects.count() == 1
    # Same Django connection, next transaction: fail closed again.
    with app_atomic():
        assert Order.objects.count() == 0
    with app_connection().cursor() as cursor:  # autocommit statement
        cursor.execute("SELECT count(*) FROM testapp_order")
        assert cursor.fetchone()[0] == 0


@pytest.mark.variants
def test_leaving_a_nested_context_restores_the_outer_tenant(orders):
    with tenant_context(A):
        with tenant_context(B):
            assert list(Order.objects.values_list("sku", flat=True)) == ["b-1"]
        assert list(Order.objects.values_list("sku", flat=True)) == ["a-1"]


@pytest.mark.variants
def test_a_nested_context_inside_a_plain_atomic_block_restores_no_tenant(orders):
    with app_atomic():
        with tenant_context(B):
            assert Order.objects.count() == 1
        assert Order.objects.count() == 0


@pytest.mark.variants
def test_a_nested_context_that_fails_restores_the_outer_tenant(orders):
    with tenant_context(A):
        with pytest.raises(DatabaseError), tenant_context(B):
            with app_connection().cursor() as cursor:
                cursor.execute("SELECT 1/0")
        assert list(Order.objects.values_list("sku", flat=True)) == ["a-1"]


# --- every tenant table, every role the privileges let at it -------------------------------

#: One row of each tenant-isolated table (the library's and the test app's), for a tenant.
ROWS = {
    "idempotency_keys": "INSERT INTO idempotency_keys (tenant_id, scope, key, request_hash,"
    " request_method, request_path, state, status_code, expires_at) VALUES (%(tenant)s, 's',"
    " %(tag)s, 'h', 'POST', '/', 'completed', 201, now() + interval '1 hour')",
    "outbox_messages": "INSERT INTO outbox_messages (tenant_id, message_id, topic, payload)"
    " VALUES (%(tenant)s, gen_random_uuid(), %(tag)s, '{}')",
    "outbox_consumer_failures": "INSERT INTO outbox_consumer_failures (tenant_id, consumer,"
    " partition, message_pk, message_id, attempts, error) VALUES (%(tenant)s, %(tag)s, 0, 1,"
    " gen_random_uuid(), 1, 'e')",
    "outbox_dead_letters": "INSERT INTO outbox_dead_letters (tenant_id, consumer, message_pk,"
    " message_id, topic, payload, headers, message_created_at, attempts, error) VALUES"
    " (%(tenant)s, %(tag)s, 1, gen_random_uuid(), 't', '{}', '{}', now(), 1, 'e')",
    "outbox_received": "INSERT INTO outbox_received (tenant_id, receiver, message_id) VALUES"
    " (%(tenant)s, %(tag)s, gen_random_uuid())",
    "testapp_order": "INSERT INTO testapp_order (tenant_id, sku, quantity, note) VALUES"
    " (%(tenant)s, %(tag)s, 1, '')",
    "testapp_payment": "INSERT INTO testapp_payment (tenant_id, order_ref, amount) VALUES"
    " (%(tenant)s, %(tag)s, 1)",
    # A refund refers to an order of its own tenant (tenancy.references): one is made with
    # it, for the transaction's tenant (for the row's own when none is set: the seeding).
    "testapp_refund": "WITH o AS (INSERT INTO testapp_order (tenant_id, sku, quantity, note) VALUES"
    " (coalesce((SELECT tenancy_current_tenant()), %(tenant)s), %(tag)s, 1, '') RETURNING id)"
    " INSERT INTO testapp_refund (tenant_id, order_id, amount) SELECT %(tenant)s, id, 1 FROM o",
}


def granted() -> list[tuple[str, str, tuple[str, ...]]]:
    """(table, kind, privileges) for every tenant table and every RLS-bound role granted on it.

    The system role is left out: it has BYPASSRLS by design (docs/roles.md) and
    its reach is its privileges, tested in test_privileges.py.
    """
    from tenancy.db import tenant_isolated_tables
    from tenancy.privileges import APP, WORKER, grants, role_names

    kinds = {role: kind for kind, role in role_names().items() if kind in (APP, WORKER)}
    return sorted(
        (g.table, kinds[g.role], g.privileges)
        for g in grants() if g.table in tenant_isolated_tables() and g.role in kinds
        and g.privileges
    )


@pytest.mark.parametrize(("table", "kind", "privileges"), [
    pytest.param(table, kind, privileges, id=f"{table}-{kind}")
    for table, kind, privileges in granted()
])
def test_every_tenant_table_is_isolated_for_every_role_granted_on_it(table, kind, privileges):
    from tenancy.aliases import worker_alias

    with observer() as conn:
        for tenant in (A, B):
            conn.execute(ROWS[table], {"tenant": tenant, "tag": f"seed-{tenant}"})
    alias = app_connection().alias if kind == "app" else worker_alias()
    with connect(alias) as conn:
        with as_tenant(conn, None) as cur:  # no tenant: nothing
            if "SELECT" in privileges:
                assert cur.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
        if "INSERT" in privileges:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level"):
                with as_tenant(conn, None) as cur:
                    cur.execute(ROWS[table], {"tenant": A, "tag": "no-tenant"})
        with as_tenant(conn, A) as cur:
            if "SELECT" in privileges:
                seen = cur.execute(f"SELECT tenant_id FROM {table}").fetchall()
                assert seen == [(A,)], seen
                assert cur.execute(f"SELECT count(*) FROM {table} WHERE tenant_id = %s",
                                   [B]).fetchone() == (0,)
            if "UPDATE" in privileges:
                cur.execute(f"UPDATE {table} SET tenant_id = tenant_id WHERE tenant_id = %s", [B])
                assert cur.rowcount == 0
            if "DELETE" in privileges:
                cur.execute(f"DELETE FROM {table} WHERE tenant_id = %s", [B])
                assert cur.rowcount == 0
        if "INSERT" in privileges:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level"):
                with as_tenant(conn, A) as cur:
                    cur.execute(ROWS[table], {"tenant": B, "tag": "forged"})
        if "UPDATE" in privileges:  # its own row, moved to the other tenant
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level"):
                with as_tenant(conn, A) as cur:
                    cur.execute(f"UPDATE {table} SET tenant_id = %s", [B])
    with observer() as conn:  # tenant 2's row is untouched, and alone
        rows = conn.execute(f"SELECT tenant_id, count(*) FROM {table} GROUP BY 1 ORDER BY 1")
        assert rows.fetchall() == [(A, 1), (B, 1)]


@pytest.mark.parametrize("table", sorted(ROWS))
def test_force_applies_the_policy_to_the_tables_owner_too(table):
    with observer() as conn:
        for tenant in (A, B):
            conn.execute(ROWS[table], {"tenant": tenant, "tag": f"seed-{tenant}"})
    with connect("owner") as conn:
        with as_tenant(conn, A) as cur:
            assert cur.execute(f"SELECT tenant_id FROM {table}").fetchall() == [(A,)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level"):
            with as_tenant(conn, A) as cur:
                cur.execute(ROWS[table], {"tenant": B, "tag": "forged"})
