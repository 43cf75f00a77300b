-- The worker role and the failures of tenants' messages.
--
-- consumer_offsets is shared by all tenants (a reader follows the one stream),
-- so it must hold nothing that belongs to a tenant: the last error of a
-- failing head message (a traceback, often with payload data) moves to
-- outbox_consumer_failures, one row per tenant, consumer and partition, under
-- the usual policy. The offset row keeps only the count and the next attempt.
-- Who may touch which table is granted by migrate (docs/roles.md); the app
-- role gets nothing on either table.

ALTER TABLE outbox_consumer_failures ENABLE ROW LEVEL SECURITY;
ALTER TABLE outbox_consumer_failures FORCE ROW LEVEL SECURITY;
CREATE POLICY outbox_consumer_failures_tenant_isolation ON outbox_consumer_failures
    USING (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint))
    WITH CHECK (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint));

-- The errors kept so far are dropped with the column (the next failure of the
-- same message records its error again; the attempt count is kept).
ALTER TABLE consumer_offsets DROP COLUMN last_error;
