"""The shop's own tenant tables follow docs/roles.md: tenant_id leads every key.

Primary keys ``(tenant_id, id)``, unique constraints and indexes led by
``tenant_id``, foreign keys within a tenant. Under SQL injected as one
tenant, neither an explicit id nor a reference tells anything about another
tenant's rows.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

import psycopg
import pytest

from tests.example.shop import _manage, shop_environment

DB = "shop_keys_test"
#: The shop's tenant tables (Merchant and Membership are global: how a request finds its tenant).
TENANT_TABLES = ["shop_order", "shop_payment", "shop_product", "shop_receipt", "shop_salesdaily"]


def superuser(db: str = DB) -> psycopg.Connection:
    return psycopg.connect(host=os.environ.get("DIO_PGSOCKET") or "127.0.0.1",
                           port=os.environ["DIO_PGPORT"], user="postgres", dbname=db,
                           autocommit=True)


@pytest.fixture(scope="module")
def shop_db() -> Iterator[dict[str, int]]:
    """The shop's database, migrated and seeded: the merchants' ids (tenants) by user."""
    environment = shop_environment(DB, "http://127.0.0.1:9")
    _manage(environment, "prepare_demo_database")
    seed = json.loads(_manage(environment, "seed_demo"))
    try:
        yield {user: data["merchant"] for user, data in seed.items()}
    finally:
        with contextlib.suppress(Exception), superuser("postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


@contextlib.contextmanager
def as_tenant(tenant: int) -> Iterator[psycopg.Connection]:
    """A transaction of the shop's web role (the app role) as ``tenant``."""
    role = os.environ.get("DIO_APP_ROLE", "dio_app")
    with psycopg.connect(host="127.0.0.1", port=os.environ["DIO_PGPORT"], user=role,
                         password=role, dbname=DB) as conn:
        with conn.transaction():
            conn.execute(f"SET LOCAL app.tenant_id = '{int(tenant)}'")
            yield conn


def test_tenant_id_leads_every_key_index_and_foreign_key_of_the_shops_tenant_tables(shop_db):
    with superuser() as conn:
        keys = conn.execute(
            """
            SELECT c.conrelid::regclass::text, c.contype,
                   (SELECT array_agg(a.attname ORDER BY k.n) FROM unnest(c.conkey)
                           WITH ORDINALITY AS k(attnum, n)
                      JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum)
              FROM pg_constraint c
             WHERE c.conrelid::regclass::text = ANY(%s) AND c.contype IN ('p', 'u', 'f')
            """, [TENANT_TABLES],
        ).fetchall()
        indexes = conn.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE tablename = ANY(%s)",
            [TENANT_TABLES],
        ).fetchall()
    primary = {table: columns for table, kind, columns in keys if kind == "p"}
    assert primary == dict.fromkeys(TENANT_TABLES, ["tenant_id", "id"])
    assert all(columns[0] == "tenant_id" for _, _, columns in keys), keys
    foreign = sorted((table, columns) for table, kind, columns in keys if kind == "f")
    assert foreign == [("shop_order", ["tenant_id", "product_id"]),
                       ("shop_payment", ["tenant_id", "order_id"])]
    assert all("(tenant_id" in definition for _, _, definition in indexes), indexes


def test_another_tenants_product_cannot_be_ordered_nor_told_from_a_missing_one(shop_db):
    alice, bob = shop_db["alice"], shop_db["bob"]
    with superuser() as conn:
        bobs_product = conn.execute("SELECT id FROM shop_product WHERE tenant_id = %s LIMIT 1",
                                    [bob]).fetchone()[0]
        missing = conn.execute("SELECT max(id) + 1000 FROM shop_product").fetchone()[0]
    errors = []
    for product in (bobs_product, missing):
        with pytest.raises(psycopg.errors.ForeignKeyViolation) as raised, as_tenant(alice) as conn:
            conn.execute(
                "INSERT INTO shop_order (tenant_id, product_id, quantity, total_cents, status,"
                " email, created_at) VALUES (%s, %s, 1, 1, 'created', 'x@example.com', now())",
                [alice, product],
            )
        diag = raised.value.diag
        errors.append(f"{diag.message_primary} {diag.message_detail}".replace(str(product), "<id>"))
    assert errors[0] == errors[1]  # the same answer for bob's product and for none
    with superuser() as conn:
        assert conn.execute("SELECT count(*) FROM shop_order").fetchone() == (0,)


def test_an_id_another_tenant_uses_is_free_for_this_one(shop_db):
    alice, bob = shop_db["alice"], shop_db["bob"]
    with superuser() as conn:
        bobs_product = conn.execute("SELECT id FROM shop_product WHERE tenant_id = %s LIMIT 1",
                                    [bob]).fetchone()[0]
    with as_tenant(alice) as conn:  # no collision with bob's row, so nothing learnt about it
        conn.execute(
            "INSERT INTO shop_product (id, tenant_id, sku, name, price_cents, stock)"
            " VALUES (%s, %s, 'PROBE', 'probe', 1, 1)", [bobs_product, alice],
        )
    with superuser() as conn:
        owners = conn.execute("SELECT tenant_id FROM shop_product WHERE id = %s ORDER BY 1",
                              [bobs_product]).fetchall()
        conn.execute("DELETE FROM shop_product WHERE sku = 'PROBE'")
    assert owners == sorted([(alice,), (bob,)])
