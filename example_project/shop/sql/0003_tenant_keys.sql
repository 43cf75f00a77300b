-- What docs/roles.md recommends for a project's tenant tables, and Django's
-- models cannot say: tenant_id leads every key, and a row refers to another
-- only within its tenant.
--
-- The primary keys become (tenant_id, id). With the key on id alone, an INSERT
-- with an explicit id (SQL injected as one tenant) would collide with another
-- tenant's row of that id and so tell that it exists.
ALTER TABLE shop_product DROP CONSTRAINT shop_product_pkey, ADD PRIMARY KEY (tenant_id, id);
ALTER TABLE shop_order DROP CONSTRAINT shop_order_pkey, ADD PRIMARY KEY (tenant_id, id);
ALTER TABLE shop_payment DROP CONSTRAINT shop_payment_pkey, ADD PRIMARY KEY (tenant_id, id);
ALTER TABLE shop_salesdaily DROP CONSTRAINT shop_salesdaily_pkey, ADD PRIMARY KEY (tenant_id, id);
ALTER TABLE shop_receipt DROP CONSTRAINT shop_receipt_pkey, ADD PRIMARY KEY (tenant_id, id);

-- Composite foreign keys, in place of Django's on the id alone (dropped by this
-- migration's AlterField operations, db_constraint=False). PostgreSQL checks a
-- foreign key without row-level security: on (product_id) alone, an order of
-- tenant 1 could name tenant 2's product, and whether the INSERT failed would
-- tell whether that product exists. On (tenant_id, product_id), the row's own
-- tenant (which the policy's WITH CHECK holds to the current one) is part of the
-- reference: only the tenant's own products can be named, and another tenant's
-- look exactly like ids that do not exist.
ALTER TABLE shop_order ADD CONSTRAINT shop_order_product_fk
    FOREIGN KEY (tenant_id, product_id) REFERENCES shop_product (tenant_id, id)
    DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE shop_payment ADD CONSTRAINT shop_payment_order_fk
    FOREIGN KEY (tenant_id, order_id) REFERENCES shop_order (tenant_id, id)
    DEFERRABLE INITIALLY DEFERRED;
