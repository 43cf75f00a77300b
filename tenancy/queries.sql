-- name: role_shapes
-- Catalogs only, no model covers them: each named role's attributes, and its role-level
-- settings for every database (database 0) and for one (%(database)s; NULL: this one), as
-- ALTER ROLE ... SET stored them ("name=value"). pg_roles and pg_db_role_setting are
-- readable by every role.
SELECT r.rolname, r.rolsuper, r.rolbypassrls, r.rolcreaterole, r.rolcreatedb,
       r.rolcanlogin, r.rolreplication, r.rolconnlimit,
       r.rolvaliduntil IS NOT NULL AND r.rolvaliduntil <> 'infinity',
       coalesce((SELECT array_agg(c.setting ORDER BY c.setting)
                   FROM pg_db_role_setting AS s, unnest(s.setconfig) AS c(setting)
                  WHERE s.setrole = r.oid AND s.setdatabase = 0), '{}'),
       coalesce((SELECT array_agg(c.setting ORDER BY c.setting)
                   FROM pg_db_role_setting AS s, unnest(s.setconfig) AS c(setting)
                  WHERE s.setrole = r.oid
                    AND s.setdatabase = (SELECT d.oid FROM pg_database AS d
                                          WHERE d.datname = coalesce(%(database)s,
                                                                     current_database()))),
                '{}'),
       coalesce(%(database)s, current_database())
  FROM pg_roles AS r
 WHERE r.rolname = ANY (%(roles)s)

-- name: default_search_path
-- The search_path sessions of an alias start with (TO DEFAULT: the server's,
-- the database's, the role's or the startup packet's), for this transaction
-- only: what tenancy.context pins the library's names to, whatever a borrower
-- SET since.
SET LOCAL search_path TO DEFAULT

-- name: current_schemas
-- The schemas of the search_path in force, those that exist, in order; every
-- name pg_catalog's, qualified, so that a session's search_path cannot
-- redirect this query either.
SELECT s FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) AS s

-- name: binding
-- The verified mode: what tenancy_context_binding() computes inside this
-- transaction (the server process and the transaction's start), read with
-- names no search_path can redirect (EXTRACT is always pg_catalog's).
SELECT pg_catalog.pg_backend_pid(), EXTRACT(epoch FROM pg_catalog.transaction_timestamp())

-- name: role_facts
-- The checks: the role an alias connects as (no model covers the catalogs).
SELECT rolname, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user

-- name: table_facts
-- The checks and the cross-tenant guard: each table's owner, row-level
-- security and policies, in the schema the alias's names are pinned to (not
-- current_schema(): a borrower may have set the session's search_path).
SELECT c.relname,
       pg_has_role(current_user, c.relowner, 'MEMBER'),
       c.relrowsecurity,
       c.relforcerowsecurity,
       row_security_active(c.oid),
       n.nspname,
       coalesce(array_agg(p.polpermissive) FILTER (WHERE p.oid IS NOT NULL), '{}'),
       coalesce(array_agg(pg_get_expr(p.polqual, p.polrelid))
                FILTER (WHERE p.oid IS NOT NULL), '{}'),
       coalesce(array_agg(pg_get_expr(p.polwithcheck, p.polrelid))
                FILTER (WHERE p.oid IS NOT NULL), '{}')
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_policy p ON p.polrelid = c.oid
 WHERE c.relname = ANY(%(tables)s)
   AND c.relkind IN ('r', 'p')
   AND n.nspname = %(schema)s
 GROUP BY c.oid, n.nspname

-- name: tenants_with_rows
-- Across tenants: the reapers' walk over the tenants of a table (the system
-- role). A loose index scan on the index tenant_id leads: one probe per
-- tenant, however many rows each has. {table} is a library table, quoted as
-- an identifier (tenancy.db.tenants_with_rows).
WITH RECURSIVE t(tenant_id) AS (
    (SELECT tenant_id FROM {table} ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT r.tenant_id FROM {table} r
             WHERE r.tenant_id > t.tenant_id ORDER BY r.tenant_id LIMIT 1)
      FROM t WHERE t.tenant_id IS NOT NULL
)
SELECT tenant_id FROM t WHERE tenant_id IS NOT NULL

-- name: existing_tables
-- The privilege matrix: which of the tables it governs exist yet.
SELECT c.relname FROM pg_class c WHERE c.relname = ANY(%(tables)s)
   AND c.relnamespace = current_schema()::regnamespace

-- name: existing_roles
-- The privilege matrix: which of the roles named in settings exist.
SELECT rolname FROM pg_roles WHERE rolname = ANY(%(roles)s)

-- name: held_privileges
-- The privilege matrix: each role's effective privilege on each table (its
-- own, a role's it belongs to, or PUBLIC's).
SELECT t.tbl, r.rolname, p.priv,
       has_table_privilege(r.rolname, format('%%I.%%I', current_schema(), t.tbl), p.priv)
  FROM unnest(%(tables)s::text[]) AS t(tbl)
 CROSS JOIN unnest(%(privileges)s::text[]) AS p(priv)
  JOIN pg_roles r ON r.rolname = ANY(%(roles)s)

-- name: owns_tables
-- The privilege matrix: whether the alias's role owns (or belongs to the owner
-- of) the tables to grant.
SELECT count(*), coalesce(bool_and(pg_has_role(current_user, c.relowner, 'USAGE')), false)
  FROM pg_class c WHERE c.relname = ANY(%(tables)s)
   AND c.relnamespace = current_schema()::regnamespace

-- name: current_schema
-- The privilege matrix's GRANT USAGE ON SCHEMA names it.
SELECT current_schema()

-- name: roles_without_schema_usage
-- The privilege matrix: the roles that cannot reach the tables' schema yet.
SELECT r.rolname FROM pg_roles r WHERE r.rolname = ANY(%(roles)s)
   AND NOT has_schema_privilege(r.rolname, current_schema(), 'USAGE')

-- name: tables_open_to_public
-- The privilege matrix: the tables it governs exactly on which PUBLIC holds a
-- privilege (it revokes it).
SELECT c.relname FROM pg_class c WHERE c.relname = ANY(%(tables)s)
   AND c.relnamespace = current_schema()::regnamespace
   AND EXISTS (SELECT FROM aclexplode(c.relacl) a WHERE a.grantee = 0)

-- name: temporary_holders
-- tenancy.E030: the roles that can create temporary tables in this database.
SELECT r.rolname FROM pg_roles r WHERE r.rolname = ANY(%(roles)s)
   AND has_database_privilege(r.oid, current_database(), 'TEMPORARY')

-- name: owns_database
-- Whether the alias's role may revoke on its database.
SELECT pg_has_role(current_user, d.datdba, 'USAGE') FROM pg_database d
 WHERE d.datname = current_database()

-- name: current_database
-- The database statements of the privilege matrix name it.
SELECT current_database()

-- name: closed_project_tables
-- tenancy.W028: the tables of the project's apps on which the app role has no
-- privilege at all.
SELECT c.relname FROM pg_class c
  JOIN pg_roles r ON r.rolname = %(role)s
 WHERE c.relname = ANY(%(tables)s) AND c.relkind IN ('r', 'p')
   AND c.relnamespace = current_schema()::regnamespace
   AND NOT has_table_privilege(r.rolname, c.oid, 'SELECT, INSERT, UPDATE, DELETE')
 ORDER BY 1

-- name: superuser_role
-- create_roles: the connection it was given must be a superuser's.
SELECT rolname, rolsuper FROM pg_roles WHERE rolname = current_user

-- name: members_of
-- create_roles: the roles that belong to the owner (none of the others may),
-- and to pg_read_all_stats (the system role should).
SELECT u.rolname FROM pg_auth_members m JOIN pg_roles o ON o.oid = m.roleid
  JOIN pg_roles u ON u.oid = m.member WHERE o.rolname = %(role)s

-- name: database_owner
-- create_roles: the database's owner, if the database exists.
SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %(database)s

-- name: database_mode
-- The verified mode: which tenancy_current_tenant() the migrations' schema has
-- (any role may read a function's definition).
SELECT p.prosrc FROM pg_proc AS p WHERE p.proname = 'tenancy_current_tenant'
   AND p.pronamespace = current_schema()::regnamespace

-- name: keys_readable
-- tenancy.E026: whether the role may read the context keys at all.
SELECT has_table_privilege('tenancy_context_keys', 'SELECT')

-- name: count_keys
-- tenancy.E026: how many keys the role reads (0 unless something is wrong).
SELECT count(*) FROM tenancy_context_keys

-- name: installed_keys
-- verified_context status (the owner).
SELECT key_id, installed_at FROM tenancy_context_keys ORDER BY installed_at, key_id

-- name: verify_token
-- verified_context: does the database accept a token of this key? The end-to-
-- end answer, in a transaction of its own, rolled back.
SELECT set_config(%(guc)s, %(token)s, true), tenancy_verified_tenant()

-- name: owner_of_functions
-- verified_context: only the tables' owner installs keys and switches modes.
SELECT pg_has_role(current_user, p.proowner, 'USAGE'), current_user
  FROM pg_proc AS p WHERE p.proname = 'tenancy_current_tenant'
   AND p.pronamespace = current_schema()::regnamespace

-- name: add_key
-- verified_context add-key: a key is never replaced in place.
INSERT INTO tenancy_context_keys (key_id, inner_pad, outer_pad)
VALUES (%(key_id)s, %(inner)s, %(outer)s)
ON CONFLICT (key_id) DO NOTHING RETURNING key_id

-- name: same_key
-- verified_context add-key: the key installed under this id is this one.
SELECT inner_pad = %(inner)s AND outer_pad = %(outer)s FROM tenancy_context_keys
 WHERE key_id = %(key_id)s

-- name: remove_key
-- verified_context remove-key.
DELETE FROM tenancy_context_keys WHERE key_id = %(key_id)s

-- name: quoted_schema
-- verified_context: the schema the redefined tenancy_current_tenant() names.
SELECT quote_ident(current_schema())
