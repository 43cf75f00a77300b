ALTER TABLE testapp_order ENABLE ROW LEVEL SECURITY;
ALTER TABLE testapp_order FORCE ROW LEVEL SECURITY;
CREATE POLICY testapp_order_tenant_isolation ON testapp_order
    USING (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint))
    WITH CHECK (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint));
