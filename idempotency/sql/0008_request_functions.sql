-- The request path's two statements on idempotency_keys, as functions.
--
-- PL/pgSQL keeps the plan of each statement in a function for the life of the
-- server session that runs it: the key's read (a join, with the row-level
-- security policy) is parsed and planned once per session instead of once per
-- request, through a transaction pooler as well as on a direct connection.
-- Unlike a prepared statement, the plan belongs to the function, which only
-- the tables' owner can change: nothing that runs on the session before (SQL
-- of the web role's, injected or not, an earlier borrower of a pooled server
-- session) can stand in for it. The functions run with the caller's rights
-- (SECURITY INVOKER), so row-level security applies as to the statements
-- they hold.

-- The key's row as the calling transaction sees it: one row, its columns NULL
-- when there is none. live: a row that is not to be treated as new (finished
-- and not expired, or pending: pending rows never expire); false for an
-- expired finished row. With lock_id, a key without a live row is also locked
-- for the transaction (pg_try_advisory_xact_lock: it never blocks), in the
-- same statement; locked says whether the lock was free.
CREATE FUNCTION idempotency_lookup(p_tenant_id bigint, p_scope text, p_key text,
                                   p_lock_id bigint DEFAULT NULL)
RETURNS TABLE (live boolean, locked boolean, leased boolean, lease_token bigint,
               fingerprint text, state text, status_code integer, response bytea,
               response_headers jsonb)
LANGUAGE plpgsql VOLATILE
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT r.live,
           CASE WHEN p_lock_id IS NULL OR r.live THEN NULL
                ELSE pg_try_advisory_xact_lock(p_lock_id) END,
           r.leased, r.lease_token, r.request_hash, r.state, r.status_code, r.response,
           r.response_headers
      FROM (SELECT k.expires_at > now() OR k.state = 'pending' AS live,
                   coalesce(k.locked_until > clock_timestamp(), false) AS leased,
                   k.lease_token, k.request_hash::text, k.state::text, k.status_code::integer,
                   k.response, k.response_headers
              FROM (SELECT 1) AS one
              LEFT JOIN idempotency_keys AS k
                ON k.tenant_id = p_tenant_id AND k.scope = p_scope AND k.key = p_key) AS r;
END
$function$;

-- A finished request under a key that had no row: a plain INSERT (no ON
-- CONFLICT: the primary key refuses a second row, and the caller answers from
-- the row that won). Times by the database clock.
CREATE FUNCTION idempotency_store(p_tenant_id bigint, p_scope text, p_key text,
                                  p_fingerprint text, p_method text, p_path text, p_state text,
                                  p_status_code integer, p_response bytea,
                                  p_response_headers jsonb, p_ttl interval)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $function$
BEGIN
    INSERT INTO idempotency_keys
           (tenant_id, scope, key, request_hash, request_method, request_path, state,
            status_code, response, response_headers, completed_at, expires_at, created_at)
    VALUES (p_tenant_id, p_scope, p_key, p_fingerprint, p_method, p_path, p_state,
            p_status_code, p_response, p_response_headers, clock_timestamp(), now() + p_ttl,
            now());
END
$function$;
