ALTER TABLE testapp_payment ENABLE ROW LEVEL SECURITY;
ALTER TABLE testapp_payment FORCE ROW LEVEL SECURITY;
CREATE POLICY testapp_payment_tenant_isolation ON testapp_payment
    USING (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint))
    WITH CHECK (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint));
