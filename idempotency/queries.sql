-- Every statement the idempotency app sends at run time, by name (loaded by
-- django_idempotency_outbox.sqlfiles.queries("idempotency")). Each is written
-- by hand for the reason beside it; what gains nothing from SQL of its own
-- uses the ORM (idempotency/store.py). Times come from the database clock:
-- now() (the transaction's start) for what a request records, clock_timestamp()
-- for leases, which a long transaction must not stretch.

-- name: lookup
-- The request path's read, in one round trip (idempotency_lookup(), migration
-- 0008: planned once per server session): the key's row and, with lock_id and
-- no live row, a try of the key's transaction-level advisory lock.
SELECT live, locked, leased, lease_token, fingerprint, state, status_code, response,
       response_headers
  FROM idempotency_lookup(%(tenant_id)s, %(scope)s, %(key)s, %(lock_id)s)

-- name: store
-- A finished request under a key that had no row (idempotency_store(),
-- migration 0008); the primary key refuses a second row.
SELECT idempotency_store(%(tenant_id)s, %(scope)s, %(key)s, %(fingerprint)s, %(method)s,
                         %(path)s, %(state)s, %(status_code)s, %(response)s,
                         %(response_headers)s::jsonb, %(ttl)s)

-- name: replace_expired
-- Taking over an expired, unreaped finished row, expired by the database
-- clock. A pending row (phases mode) never expires into "new": its work may be
-- half done.
UPDATE idempotency_keys
   SET request_hash = %(fingerprint)s, request_method = %(method)s, request_path = %(path)s,
       state = %(state)s, status_code = %(status_code)s, response = %(response)s,
       response_headers = %(response_headers)s::jsonb, completed_at = clock_timestamp(),
       expires_at = now() + %(ttl)s, created_at = now()
 WHERE tenant_id = %(tenant_id)s AND scope = %(scope)s AND key = %(key)s
   AND expires_at <= now() AND state <> 'pending'

-- name: claim
-- Phases mode: a new key, or an expired finished one taken over, in one
-- statement (ON CONFLICT): the claim must not lose a race to a duplicate. The
-- fencing token starts at 1 and grows by one with each new owner.
INSERT INTO idempotency_keys AS k
       (tenant_id, scope, key, lease_token, request_hash, request_method, request_path, state,
        expires_at, recovery_point, phase_state, request_data, request_id, locked_until,
        created_at, updated_at)
VALUES (%(tenant_id)s, %(scope)s, %(key)s, 1, %(fingerprint)s, %(method)s, %(path)s, 'pending',
        now() + %(ttl)s, %(recovery_point)s, '{}', %(request_data)s::jsonb, gen_random_uuid(),
        clock_timestamp() + %(lease)s, now(), now())
ON CONFLICT (tenant_id, scope, key) DO UPDATE
   SET lease_token = k.lease_token + 1,
       request_hash = excluded.request_hash, request_method = excluded.request_method,
       request_path = excluded.request_path, state = excluded.state, status_code = NULL,
       response = NULL, response_headers = NULL, completed_at = NULL,
       expires_at = excluded.expires_at, recovery_point = excluded.recovery_point,
       phase_state = excluded.phase_state, request_data = excluded.request_data,
       request_id = excluded.request_id, locked_until = excluded.locked_until,
       created_at = excluded.created_at, updated_at = excluded.updated_at
 WHERE k.state <> 'pending' AND k.expires_at <= now()
RETURNING lease_token AS token, recovery_point, phase_state, request_id::text AS request_id

-- name: take_over
-- Phases mode: a compare-and-set on the fencing token, against the lease by
-- clock_timestamp().
UPDATE idempotency_keys
   SET lease_token = lease_token + 1, locked_until = clock_timestamp() + %(lease)s,
       updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND scope = %(scope)s AND key = %(key)s
   AND state = 'pending' AND lease_token = %(token)s
   AND (locked_until IS NULL OR locked_until <= clock_timestamp())
RETURNING lease_token AS token, recovery_point, phase_state, request_id::text AS request_id

-- name: advance
-- Phases mode: a compare-and-set on the fencing token; the lease is renewed
-- by clock_timestamp().
UPDATE idempotency_keys
   SET recovery_point = %(recovery_point)s, phase_state = %(phase_state)s::jsonb,
       locked_until = clock_timestamp() + %(lease)s, updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND scope = %(scope)s AND key = %(key)s
   AND state = 'pending' AND lease_token = %(token)s

-- name: finish
-- Phases mode: the final answer, a compare-and-set on the fencing token.
UPDATE idempotency_keys
   SET state = %(state)s, status_code = %(status_code)s, response = %(response)s,
       response_headers = %(response_headers)s::jsonb, completed_at = clock_timestamp(),
       expires_at = now() + %(ttl)s, recovery_point = 'finished',
       phase_state = %(phase_state)s::jsonb, locked_until = NULL, updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND scope = %(scope)s AND key = %(key)s
   AND state = 'pending' AND lease_token = %(token)s

-- name: release
-- Phases mode: the lease of the owner with the token ends at once (a no-op if
-- another owner took it over).
UPDATE idempotency_keys SET locked_until = NULL, updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND scope = %(scope)s AND key = %(key)s
   AND state = 'pending' AND lease_token = %(token)s

-- name: forget
-- Phases mode: a compare-and-set on the fencing token in the DELETE itself
-- (QuerySet.delete() would select first and delete by primary key where
-- delete signals have receivers).
DELETE FROM idempotency_keys
 WHERE tenant_id = %(tenant_id)s AND scope = %(scope)s AND key = %(key)s
   AND state = 'pending' AND lease_token = %(token)s AND recovery_point = %(recovery_point)s

-- name: count_completer_failure
-- One more failed completer run of a pending key; the count comes back in the
-- same round trip.
UPDATE idempotency_keys SET completer_runs = completer_runs + 1
 WHERE tenant_id = %(tenant_id)s AND scope = %(scope)s AND key = %(key)s AND state = 'pending'
RETURNING completer_runs

-- name: give_up
-- Giving up on one pending key nobody holds (a run holding a lease decides
-- itself): the "abandoned" answer; the recovery point stays, to show where it
-- stopped.
UPDATE idempotency_keys
   SET state = %(state)s, status_code = %(status_code)s, response = %(response)s,
       response_headers = %(response_headers)s::jsonb, completed_at = clock_timestamp(),
       expires_at = now() + %(ttl)s, locked_until = NULL, updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND scope = %(scope)s AND key = %(key)s AND state = 'pending'
   AND (locked_until IS NULL OR locked_until <= clock_timestamp())
RETURNING recovery_point

-- name: give_up_untouched
-- The reaper's batch of pending keys nobody has touched for a long time,
-- chosen and locked in the UPDATE itself (SKIP LOCKED: a request that holds one
-- is working on it), oldest first, by the database clock.
-- Across tenants: the reaper's batch (the system role), oldest keys of any tenant.
UPDATE idempotency_keys
   SET state = %(state)s, status_code = %(status_code)s, response = %(response)s,
       response_headers = %(response_headers)s::jsonb, completed_at = clock_timestamp(),
       expires_at = now() + %(ttl)s, locked_until = NULL, updated_at = now()
 WHERE ctid = ANY(ARRAY(
       SELECT ctid FROM idempotency_keys
        WHERE state = 'pending' AND (locked_until IS NULL OR locked_until <= clock_timestamp())
          AND coalesce(updated_at, created_at) < now() - %(after)s
        ORDER BY created_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED))
RETURNING tenant_id, scope, key, recovery_point

-- name: commit_without_flush
-- The reaper's batches: one lost in a crash is deleted again by the next run,
-- so its commit need not wait for the WAL flush (nor make others wait).
SET LOCAL synchronous_commit = off

-- name: delete_expired_batch
-- The reaper's batch of one tenant's expired finished keys, chosen and locked
-- in the DELETE itself, skipping rows a live request holds (SKIP LOCKED),
-- oldest first, by the database clock (DELETE has no LIMIT).
DELETE FROM idempotency_keys
 WHERE tenant_id = %(tenant_id)s AND ctid = ANY(ARRAY(
       SELECT ctid FROM idempotency_keys
        WHERE tenant_id = %(tenant_id)s AND expires_at <= now() AND state <> 'pending'
        ORDER BY expires_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED))

-- name: claim_lease
-- A single-instance job's lease (django_idempotency_outbox.leases): taken when
-- free, run out, or already this owner's, by the database clock, in one
-- compare-and-set.
UPDATE idempotency_leases
   SET owner = %(owner)s, until = now() + make_interval(secs => %(seconds)s)
 WHERE name = %(name)s AND (owner = %(owner)s OR until IS NULL OR until < now())
RETURNING until

-- name: renew_lease
-- Only while it is still this owner's. The commit does not wait for the WAL
-- flush: a renewal lost in a crash costs nothing (everyone reconnects after
-- one), and a slow flush must not make a live holder miss its renewal.
UPDATE idempotency_leases
   SET until = now() + make_interval(secs => %(seconds)s)
  FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async
 WHERE name = %(name)s AND owner = %(owner)s

-- name: release_lease
-- Given up at once, so that another instance takes over without waiting.
UPDATE idempotency_leases SET until = NULL, owner = ''
 WHERE name = %(name)s AND owner = %(owner)s

-- name: lease_holder
-- Who holds a lease and until when, for the message of a job that found it taken.
SELECT owner, until FROM idempotency_leases WHERE name = %(name)s
