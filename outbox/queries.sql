-- name: role_powers
-- The catalog: what the role this alias connects as may do about another
-- role's session (pg_stat_activity hides its query and start without
-- pg_read_all_stats; pg_terminate_backend() needs a superuser, a member of
-- pg_signal_backend, or a member of the session's own role). No model maps
-- pg_roles, and pg_has_role() is a function.
SELECT current_user::text, r.rolsuper,
       pg_has_role('pg_signal_backend', 'MEMBER'),
       pg_has_role('pg_read_all_stats', 'MEMBER'),
       coalesce(pg_has_role(current_user, h.oid, 'MEMBER'), false)
  FROM pg_roles AS r
  LEFT JOIN pg_roles AS h ON h.rolname = %(holder)s
 WHERE r.rolname = current_user
