-- The shop's tenant tables get the same policy as the library's.
DO $$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['shop_product', 'shop_order', 'shop_payment', 'shop_salesdaily',
                           'shop_receipt'] LOOP
    EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
    EXECUTE format(
      'CREATE POLICY %I ON %I USING (tenant_id = (SELECT nullif(current_setting(''app.tenant_id'', true), '''')::bigint)) '
      'WITH CHECK (tenant_id = (SELECT nullif(current_setting(''app.tenant_id'', true), '''')::bigint))',
      t || '_tenant_isolation', t);
  END LOOP;
END
$$;
