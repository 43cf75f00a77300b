ALTER TABLE consumer_offsets ADD COLUMN last_error text NOT NULL DEFAULT '';
DROP POLICY outbox_consumer_failures_tenant_isolation ON outbox_consumer_failures;
ALTER TABLE outbox_consumer_failures NO FORCE ROW LEVEL SECURITY;
ALTER TABLE outbox_consumer_failures DISABLE ROW LEVEL SECURITY;
