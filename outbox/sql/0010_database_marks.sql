-- What the fence and health read of a message is the database's to say, never its
-- writer's (docs/guarantees.md, "Marks of someone else's"; docs/roles.md, the threat
-- model):
--
--   - a message's time (created_at) and transaction (xid) are written by the trigger,
--     whatever the INSERT said: one message dated 2999 made the readers' lag negative,
--     and health said "ok" while a tenant was held back;
--   - a transaction counts as a publisher of a tenant only if the trigger marked it
--     for that tenant: beside the tenant's advisory lock it takes a *proof*, a second
--     shared advisory lock whose key is a MAC (a secret only the tables' owner reads)
--     of the transaction's id and the tenant. Advisory locks belong to no one; a
--     transaction that merely takes the outbox's write lock (LOCK TABLE ... IN ROW
--     EXCLUSIVE MODE, which INSERT allows) and a lock in the fence's key space cannot
--     make the proof, so it holds no tenant back. A proof seen in pg_locks is bound to
--     the transaction that took it: copied into another, it proves nothing.
--
-- outbox_mark_publisher_v2() and outbox_publishers_v2() keep their names and what they
-- mean (mark the publisher and give the id; the publishers in flight): no process of
-- either release calls the trigger's function, and a reader of the previous release
-- (outbox_read_v2()) is only the more exact for the stricter list of publishers.

-- Publishers in flight carry marks without a proof, which the new readers would not
-- count: wait for them (an INSERT holds ROW EXCLUSIVE until its transaction ends), and
-- keep readers and new publishers out until both functions are replaced.
LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE;

-- The proofs' secret: one row, read only by the owner's functions. Row-level security
-- with no policy: a role granted SELECT by mistake still sees no row (BYPASSRLS
-- excepted: the privilege matrix gives no role any privilege here).
CREATE TABLE outbox_fence_key (secret bytea NOT NULL CHECK (length(secret) >= 16));
CREATE UNIQUE INDEX outbox_fence_key_one_row ON outbox_fence_key ((true));
ALTER TABLE outbox_fence_key ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON outbox_fence_key FROM PUBLIC;
INSERT INTO outbox_fence_key (secret)
SELECT decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex');

-- The proof that the trigger marked transaction xid (its 32-bit form, as pg_locks
-- shows it) for tenant: the two-int4 form of an advisory key (objsubid 2 in pg_locks),
-- the tag 28532 (0x6F74) in the high 16 bits of the first key, 48 bits of a keyed
-- SHA-256 of the two (a fixed-length input, the digest truncated: nothing to extend)
-- below it and in the second. NULL when the key is missing:
-- then no proof can be taken, and the trigger marks its transaction as publishing for
-- any tenant (holds back more, never less). Only the owner may run it: anyone else
-- could prove anything.
CREATE FUNCTION outbox_fence_proof_v1(transaction_id bigint, tenant bigint) RETURNS integer[]
LANGUAGE sql STABLE
AS $function$
    SELECT ARRAY[(28532 << 16) | (get_byte(d.h, 0) << 8) | get_byte(d.h, 1),
                 ('x' || encode(substring(d.h FROM 3 FOR 4), 'hex'))::bit(32)::integer]
      FROM (SELECT sha256(k.secret || int8send(transaction_id) || int8send(tenant)) AS h
              FROM outbox_fence_key AS k) AS d
$function$;
REVOKE ALL ON FUNCTION outbox_fence_proof_v1(bigint, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION outbox_mark_publisher_v2() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $function$
DECLARE
    bound bigint;
    proof integer[];
BEGIN
    -- It runs as the owner: only as the trigger of outbox_messages.
    IF TG_RELID <> 'outbox_messages'::regclass OR TG_WHEN <> 'BEFORE' OR TG_LEVEL <> 'ROW'
       OR TG_OP <> 'INSERT' THEN
        RAISE EXCEPTION 'outbox: outbox_mark_publisher_v2() marks the inserts of outbox_messages only'
              USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.id IS NOT NULL THEN
        RAISE EXCEPTION 'outbox: a message''s id is given by the database, not by its writer'
              USING ERRCODE = 'insufficient_privilege',
                    HINT = 'Insert without an id (outbox.publish() does).';
    END IF;
    -- When, and by which transaction: the database's (the start of the transaction,
    -- as the column's default; a writer's value is replaced, not trusted).
    NEW.created_at := now();
    NEW.xid := pg_current_xact_id();
    -- Advisory locks belong to no one: any session may hold an exclusive lock
    -- on the key of a mark, and would block a shared request for it. So every
    -- mark is only tried, and a mark that cannot be taken is replaced by one
    -- that holds back more, never less.
    --
    -- The bound, once per transaction: the last id handed out so far
    -- (sequences are read outside MVCC), below every id taken from now on.
    -- The transaction-local setting only spares the work for later rows; it
    -- is never trusted: a transaction whose tenant marks have no bound mark
    -- (a forged setting, or a key held by someone else) has its tenants held
    -- back whole (outbox_publishers_v2()).
    IF current_setting('outbox.publishing', true) IS DISTINCT FROM NEW.xid::text THEN
        SELECT least(CASE WHEN is_called THEN last_value ELSE last_value - 1 END,
                     281474976710655)
          INTO bound FROM outbox_message_ids;
        PERFORM pg_try_advisory_xact_lock_shared(1868693504 | (bound >> 32)::integer,
                                                 (bound & 4294967295)::bit(32)::integer),
                set_config('outbox.publishing', NEW.xid::text, true);
    END IF;
    -- The tenant's mark and its proof, for every row (the row's own (sub)transaction:
    -- a row that survives has marks that survive with it; nothing here trusts a
    -- setting). If either cannot be taken, the transaction is marked as publishing
    -- for any tenant instead.
    proof := outbox_fence_proof_v1(NEW.xid::text::bigint & 4294967295, NEW.tenant_id);
    IF NOT (pg_try_advisory_xact_lock_shared(NEW.tenant_id)
            AND coalesce(pg_try_advisory_xact_lock_shared(proof[1], proof[2]), false)) THEN
        LOCK TABLE outbox_publishing_any_tenant IN ROW EXCLUSIVE MODE;
    END IF;
    NEW.id := nextval('outbox_message_ids');
    RETURN NEW;
END
$function$;
REVOKE ALL ON FUNCTION outbox_mark_publisher_v2() FROM PUBLIC;

CREATE OR REPLACE FUNCTION outbox_publishers_v2()
RETURNS TABLE (virtualtransaction text, pid integer, tenant_id bigint, bound bigint)
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $function$
    -- pg_locks is read once (each reference would read the lock table anew):
    -- a publisher's marks, proofs and write lock are seen together or not at all.
    WITH locks AS MATERIALIZED (
        SELECT l.locktype, l.virtualtransaction, l.pid, l.relation, l.classid, l.objid,
               l.objsubid, l.transactionid
          FROM pg_catalog.pg_locks AS l
         WHERE l.granted
           AND ((l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock')
                OR (l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d
                                   WHERE d.datname = pg_catalog.current_database())
                    AND (l.locktype = 'advisory'
                         OR (l.locktype = 'relation' AND l.mode = 'RowExclusiveLock'
                             AND l.relation IN ('outbox_messages'::regclass,
                                                'outbox_publishing_any_tenant'::regclass)))))
    ),
    writers AS (
        SELECT DISTINCT w.virtualtransaction, w.pid FROM locks AS w
         WHERE w.locktype = 'relation' AND w.relation = 'outbox_messages'::regclass
    ),
    bounds AS (
        SELECT b.virtualtransaction,
               min(((b.classid::bigint & 65535) << 32) | b.objid::bigint) AS bound
          FROM locks AS b
         WHERE b.locktype = 'advisory' AND b.objsubid = 2 AND b.classid::bigint >> 16 = 28514
         GROUP BY b.virtualtransaction
    ),
    proofs AS (
        SELECT p.virtualtransaction, p.classid::bigint AS first_key, p.objid::bigint AS second_key
          FROM locks AS p
         WHERE p.locktype = 'advisory' AND p.objsubid = 2 AND p.classid::bigint >> 16 = 28532
    ),
    -- A writer's tenant mark counts only beside its proof, made for one of the
    -- transaction ids that writer holds (its own: a copied proof names another).
    tenants AS (
        SELECT t.virtualtransaction, (t.classid::bigint << 32) | t.objid::bigint AS tenant_id
          FROM locks AS t
          JOIN writers AS w ON w.virtualtransaction = t.virtualtransaction
          JOIN locks AS x ON x.virtualtransaction = t.virtualtransaction
                         AND x.locktype = 'transactionid'
         CROSS JOIN LATERAL outbox_fence_proof_v1(x.transactionid::text::bigint,
                                                  (t.classid::bigint << 32) | t.objid::bigint)
               AS m(proof)
         WHERE t.locktype = 'advisory' AND t.objsubid = 1
           AND EXISTS (SELECT FROM proofs AS p
                        WHERE p.virtualtransaction = t.virtualtransaction
                          AND p.first_key = m.proof[1]::bigint & 4294967295
                          AND p.second_key = m.proof[2]::bigint & 4294967295)
        UNION
        -- "any tenant": NULL (only the trigger can take this lock)
        SELECT a.virtualtransaction, NULL FROM locks AS a
         WHERE a.locktype = 'relation' AND a.relation = 'outbox_publishing_any_tenant'::regclass
    )
    -- No bound mark: the tenants are held back whole, from position 0.
    SELECT w.virtualtransaction, w.pid, t.tenant_id, coalesce(b.bound, 0)
      FROM writers AS w
      JOIN tenants AS t ON t.virtualtransaction = w.virtualtransaction
      LEFT JOIN bounds AS b ON b.virtualtransaction = w.virtualtransaction
$function$;

-- Messages a writer dated in the future (before the trigger wrote the time): their
-- time is at most now. As the owner, past the policy (FORCE is put back at once; the
-- table is locked meanwhile).
ALTER TABLE outbox_messages NO FORCE ROW LEVEL SECURITY;
UPDATE outbox_messages SET created_at = now() WHERE created_at > now();
ALTER TABLE outbox_messages FORCE ROW LEVEL SECURITY;

-- The functions see this schema whatever the caller's search_path (and pg_temp last,
-- so that no temporary object can stand in for ours). CREATE OR REPLACE reset them.
DO $migrate$
BEGIN
    EXECUTE format('ALTER FUNCTION outbox_fence_proof_v1(bigint, bigint) SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION outbox_mark_publisher_v2() SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION outbox_publishers_v2() SET search_path = %I, pg_temp',
                   current_schema());
END
$migrate$;
