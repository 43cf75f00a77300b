-- The verified tenant context (docs/roles.md, "A tenant context injected SQL
-- cannot forge"). Every policy of the library compares tenant_id with
-- tenancy_current_tenant(). This file defines it in the plain form (the
-- setting app.tenant_id, as before); `manage.py verified_context enable`,
-- run by the owner, redefines it to return only a tenant whose token
-- verifies. Only the owner of a function can redefine it: the switch is not
-- something the app role can flip.

-- The keys the database accepts, kept as HMAC-SHA256's two padded keys
-- (key XOR ipad, key XOR opad), from which the built-in sha256() computes the
-- HMAC: no extension (pgcrypto) to install. They are as secret as the key.
CREATE TABLE tenancy_context_keys (
    key_id text PRIMARY KEY CHECK (key_id ~ '^[A-Za-z0-9_-]{1,64}$'),
    inner_pad bytea NOT NULL CHECK (length(inner_pad) = 64),
    outer_pad bytea NOT NULL CHECK (length(outer_pad) = 64),
    installed_at timestamptz NOT NULL DEFAULT now()
);
-- Row-level security with no policy: no role but the owner (the table's
-- owner, whom RLS does not bind unless FORCEd) sees or writes a row, even
-- after a blanket `GRANT ... ON ALL TABLES IN SCHEMA` (docs/roles.md grants
-- one). The functions below read it as the owner (SECURITY DEFINER).
REVOKE ALL ON tenancy_context_keys FROM PUBLIC;
ALTER TABLE tenancy_context_keys ENABLE ROW LEVEL SECURITY;

-- What a token is bound to: this server process and the start of this
-- transaction (microseconds since the epoch, exact: extract() is numeric).
-- Both are fixed for the whole transaction, in every savepoint, and neither
-- can be set by SQL; the next transaction, on this backend or any other, has
-- another. Parallel workers have other pids: PARALLEL RESTRICTED keeps it in
-- the leader.
CREATE FUNCTION tenancy_context_binding() RETURNS text
LANGUAGE sql STABLE PARALLEL RESTRICTED
AS $function$
    SELECT pg_backend_pid()::text || '.'
           || (extract(epoch FROM transaction_timestamp()) * 1000000)::bigint::text
$function$;

-- The tenant named by the setting app.tenant_token, if its MAC verifies for
-- this transaction with an installed key; NULL otherwise (no row visible, no
-- row writable). The token is '<tenant>.<key id>.<hex HMAC-SHA256 of
-- "v1.<tenant>.<binding>">', minted by the web process, which holds the key.
CREATE FUNCTION tenancy_verified_tenant() RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER PARALLEL RESTRICTED
AS $function$
DECLARE
    token text := current_setting('app.tenant_token', true);
    tenant text := split_part(token, '.', 1);
    wanted text := split_part(token, '.', 2);
    pads record;
BEGIN
    -- No regular expression: PostgreSQL's takes a millisecond to match one
    -- with bounded repeats. The whole token is compared with the one it
    -- should be, so nothing needs parsing but the key id.
    IF token IS NULL OR token = '' THEN
        RETURN NULL;
    END IF;
    SELECT k.inner_pad, k.outer_pad INTO pads
      FROM tenancy_context_keys AS k WHERE k.key_id = wanted;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- HMAC(key, m) = sha256(outer_pad || sha256(inner_pad || m)). The tokens
    -- are compared through sha256, so that the comparison's timing says
    -- nothing about the expected token's bytes.
    IF sha256(convert_to(token, 'UTF8'))
       = sha256(convert_to(tenant || '.' || wanted || '.' || encode(
             sha256(pads.outer_pad || sha256(pads.inner_pad
                 || convert_to('v1.' || tenant || '.' || tenancy_context_binding(), 'UTF8'))),
             'hex'), 'UTF8')) THEN
        -- Verified: the web process minted it from an int of the bigint range.
        RETURN tenant::bigint;
    END IF;
    RETURN NULL;
END
$function$;

-- The plain form: what the policies compared with before this migration.
-- Inlined by the planner, so plain mode costs what it cost before.
CREATE FUNCTION tenancy_current_tenant() RETURNS bigint
LANGUAGE sql STABLE
AS $function$
    SELECT nullif(current_setting('app.tenant_id', true), '')::bigint
$function$;

DO $migrate$
BEGIN
    EXECUTE format('ALTER FUNCTION tenancy_verified_tenant() SET search_path = %I, pg_temp',
                   current_schema());
END
$migrate$;
