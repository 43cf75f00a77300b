ALTER POLICY outbox_messages_tenant_isolation ON outbox_messages
    USING (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint))
    WITH CHECK (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint));
ALTER POLICY outbox_dead_letters_tenant_isolation ON outbox_dead_letters
    USING (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint))
    WITH CHECK (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint));
ALTER POLICY outbox_received_tenant_isolation ON outbox_received
    USING (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint))
    WITH CHECK (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint));
ALTER POLICY outbox_consumer_failures_tenant_isolation ON outbox_consumer_failures
    USING (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint))
    WITH CHECK (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint));
