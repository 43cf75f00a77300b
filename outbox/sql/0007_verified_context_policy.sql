-- The policies compare tenant_id with tenancy_current_tenant() (tenancy's
-- migration 0001): the setting app.tenant_id, as before, until the owner turns
-- the verified tenant context on (docs/roles.md).
ALTER POLICY outbox_messages_tenant_isolation ON outbox_messages
    USING (tenant_id = (SELECT tenancy_current_tenant()))
    WITH CHECK (tenant_id = (SELECT tenancy_current_tenant()));
ALTER POLICY outbox_dead_letters_tenant_isolation ON outbox_dead_letters
    USING (tenant_id = (SELECT tenancy_current_tenant()))
    WITH CHECK (tenant_id = (SELECT tenancy_current_tenant()));
ALTER POLICY outbox_received_tenant_isolation ON outbox_received
    USING (tenant_id = (SELECT tenancy_current_tenant()))
    WITH CHECK (tenant_id = (SELECT tenancy_current_tenant()));
ALTER POLICY outbox_consumer_failures_tenant_isolation ON outbox_consumer_failures
    USING (tenant_id = (SELECT tenancy_current_tenant()))
    WITH CHECK (tenant_id = (SELECT tenancy_current_tenant()));
