-- The policies compare tenant_id with tenancy_current_tenant() (tenancy's
-- migration 0001): the setting app.tenant_id, as before, until the owner turns
-- the verified tenant context on (docs/roles.md).
ALTER POLICY testapp_order_tenant_isolation ON testapp_order
    USING (tenant_id = (SELECT tenancy_current_tenant()))
    WITH CHECK (tenant_id = (SELECT tenancy_current_tenant()));
ALTER POLICY testapp_payment_tenant_isolation ON testapp_payment
    USING (tenant_id = (SELECT tenancy_current_tenant()))
    WITH CHECK (tenant_id = (SELECT tenancy_current_tenant()));
