-- Row-level security for the tenant-isolated models of the project's apps
-- (tenancy/policies.py, docs/roles.md). makemigrations writes, for each such
-- model, an AddConstraint of tenancy.policies.TenantIsolation, whose SQL
-- calls these two functions: the migration stays one line, and the policy
-- is the design's, whatever version of the library wrote the migration.
--
-- tenancy_isolate enables and forces row-level security on the table and
-- creates its one policy, which compares tenant_id with
-- tenancy_current_tenant() in USING and WITH CHECK (so it holds in the plain
-- and in the verified tenant context). A policy of the same name that a
-- hand-written migration created before is replaced, not duplicated: its
-- definition, and the table's RLS flags as they were, go into the new
-- policy's comment, from which tenancy_release puts them back when the
-- migration is reversed. Both run as their caller: only the table's owner
-- (the role that runs migrate) can change its policies.

CREATE FUNCTION tenancy_isolate(tbl regclass, policy name) RETURNS void
LANGUAGE plpgsql
AS $function$
DECLARE
    before jsonb;
    replaced text;
BEGIN
    SELECT jsonb_build_object('enabled', c.relrowsecurity, 'forced', c.relforcerowsecurity)
      INTO before FROM pg_class c WHERE c.oid = tbl;
    SELECT format('CREATE POLICY %I ON %s AS %s FOR %s TO %s%s%s',
                  p.polname, tbl,
                  CASE WHEN p.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
                  CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT'
                                WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
                  coalesce((SELECT string_agg(CASE WHEN r.oid IS NULL THEN 'PUBLIC'
                                                   ELSE quote_ident(r.rolname) END, ', ')
                              FROM unnest(p.polroles) AS u(role_oid)
                              LEFT JOIN pg_roles r ON r.oid = u.role_oid), 'PUBLIC'),
                  ' USING (' || pg_get_expr(p.polqual, p.polrelid) || ')',
                  ' WITH CHECK (' || pg_get_expr(p.polwithcheck, p.polrelid) || ')')
      INTO replaced
      FROM pg_policy p WHERE p.polrelid = tbl AND p.polname = policy;
    IF replaced IS NOT NULL THEN
        before := before || jsonb_build_object('replaced', replaced);
        EXECUTE format('DROP POLICY %I ON %s', policy, tbl);
    END IF;
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', tbl);
    EXECUTE format('CREATE POLICY %I ON %s'
                   ' USING (tenant_id = (SELECT tenancy_current_tenant()))'
                   ' WITH CHECK (tenant_id = (SELECT tenancy_current_tenant()))', policy, tbl);
    EXECUTE format('COMMENT ON POLICY %I ON %s IS %L', policy, tbl,
                   'tenancy_isolate: ' || before::text);
END
$function$;

CREATE FUNCTION tenancy_release(tbl regclass, policy name) RETURNS void
LANGUAGE plpgsql
AS $function$
DECLARE
    note text;
    before jsonb := '{}';
BEGIN
    SELECT obj_description(p.oid, 'pg_policy') INTO note
      FROM pg_policy p WHERE p.polrelid = tbl AND p.polname = policy;
    IF left(note, 17) = 'tenancy_isolate: ' THEN
        before := substr(note, 18)::jsonb;
    END IF;
    EXECUTE format('DROP POLICY IF EXISTS %I ON %s', policy, tbl);
    IF before->>'replaced' IS NOT NULL THEN
        EXECUTE before->>'replaced';
    END IF;
    IF NOT coalesce((before->>'forced')::boolean, false) THEN
        EXECUTE format('ALTER TABLE %s NO FORCE ROW LEVEL SECURITY', tbl);
    END IF;
    IF NOT coalesce((before->>'enabled')::boolean, false) THEN
        EXECUTE format('ALTER TABLE %s DISABLE ROW LEVEL SECURITY', tbl);
    END IF;
END
$function$;

REVOKE ALL ON FUNCTION tenancy_isolate(regclass, name) FROM PUBLIC;
REVOKE ALL ON FUNCTION tenancy_release(regclass, name) FROM PUBLIC;
