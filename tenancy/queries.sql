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
