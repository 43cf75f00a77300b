DROP FUNCTION tenancy_release(regclass, name);
DROP FUNCTION tenancy_isolate(regclass, name);
