-- The policies compare tenant_id with tenancy_current_tenant() (tenancy's
-- migration 0001): the setting app.tenant_id, as before, until the owner turns
-- the verified tenant context on (docs/roles.md).
ALTER POLICY idempotency_keys_tenant_isolation ON idempotency_keys
    USING (tenant_id = (SELECT tenancy_current_tenant()))
    WITH CHECK (tenant_id = (SELECT tenancy_current_tenant()));
