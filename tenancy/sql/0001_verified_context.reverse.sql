DROP FUNCTION tenancy_current_tenant();
DROP FUNCTION tenancy_verified_tenant();
DROP FUNCTION tenancy_context_binding();
DROP TABLE tenancy_context_keys;
