-- Tenant isolation for idempotency_keys, enforced by PostgreSQL.
-- FORCE makes the policy apply to the table owner too. No tenant set means
-- no row visible and no row insertable (the comparison with NULL fails).
ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency_keys FORCE ROW LEVEL SECURITY;

CREATE POLICY idempotency_keys_tenant_isolation ON idempotency_keys
    USING (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint))
    WITH CHECK (tenant_id = (SELECT nullif(current_setting('app.tenant_id', true), '')::bigint));
