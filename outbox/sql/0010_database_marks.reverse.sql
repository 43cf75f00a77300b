-- Back to 0008's marks: the trigger no longer writes the time nor takes proofs, and
-- readers count every tenant mark of a writer again. Publishers in flight are waited
-- for (their proofs would no longer be looked at; their marks still count).

LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE;

CREATE OR REPLACE FUNCTION outbox_mark_publisher_v2() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $function$
DECLARE
    bound bigint;
BEGIN
    IF NEW.id IS NOT NULL THEN
        RAISE EXCEPTION 'outbox: a message''s id is given by the database, not by its writer'
              USING ERRCODE = 'insufficient_privilege',
                    HINT = 'Insert without an id (outbox.publish() does).';
    END IF;
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
    IF current_setting('outbox.publishing', true) IS DISTINCT FROM pg_current_xact_id()::text THEN
        SELECT least(CASE WHEN is_called THEN last_value ELSE last_value - 1 END,
                     281474976710655)
          INTO bound FROM outbox_message_ids;
        -- The key of a bound's lock: the two-int4 form (objsubid 2 in pg_locks),
        -- the tag 28514 (0x6F62) in the high 16 bits of the first key and the
        -- bound's upper 16 bits below it, its lower 32 bits in the second.
        -- Taken in the same (sub)transaction as the setting, so both go
        -- together when a savepoint rolls back.
        PERFORM pg_try_advisory_xact_lock_shared(1868693504 | (bound >> 32)::integer,
                                                 (bound & 4294967295)::bit(32)::integer),
                set_config('outbox.publishing', pg_current_xact_id()::text, true);
    END IF;
    -- The tenant's mark, for every row: the bigint form (objsubid 1). Taken in
    -- the row's own (sub)transaction, so a row that survives always has a mark
    -- that survives with it. If someone holds the tenant's key exclusively,
    -- the transaction is marked as publishing for any tenant instead.
    IF NOT pg_try_advisory_xact_lock_shared(NEW.tenant_id) THEN
        LOCK TABLE outbox_publishing_any_tenant IN ROW EXCLUSIVE MODE;
    END IF;
    NEW.id := nextval('outbox_message_ids');
    RETURN NEW;
END
$function$;

GRANT EXECUTE ON FUNCTION outbox_mark_publisher_v2() TO PUBLIC;

CREATE OR REPLACE FUNCTION outbox_publishers_v2()
RETURNS TABLE (virtualtransaction text, pid integer, tenant_id bigint, bound bigint)
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $function$
    -- pg_locks is read once (each reference would read the lock table anew):
    -- a publisher's marks and its write lock are seen together or not at all.
    WITH locks AS MATERIALIZED (
        SELECT l.locktype, l.virtualtransaction, l.pid, l.relation, l.classid, l.objid,
               l.objsubid
          FROM pg_catalog.pg_locks AS l
         WHERE l.granted
           AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d
                              WHERE d.datname = pg_catalog.current_database())
           AND (l.locktype = 'advisory'
                OR (l.locktype = 'relation' AND l.mode = 'RowExclusiveLock'
                    AND l.relation IN ('outbox_messages'::regclass,
                                       'outbox_publishing_any_tenant'::regclass)))
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
    tenants AS (
        SELECT t.virtualtransaction, (t.classid::bigint << 32) | t.objid::bigint AS tenant_id
          FROM locks AS t
         WHERE t.locktype = 'advisory' AND t.objsubid = 1
        UNION
        -- "any tenant": NULL
        SELECT a.virtualtransaction, NULL FROM locks AS a
         WHERE a.locktype = 'relation' AND a.relation = 'outbox_publishing_any_tenant'::regclass
    )
    -- No bound mark: the tenants are held back whole, from position 0.
    SELECT w.virtualtransaction, w.pid, t.tenant_id, coalesce(b.bound, 0)
      FROM writers AS w
      JOIN tenants AS t ON t.virtualtransaction = w.virtualtransaction
      LEFT JOIN bounds AS b ON b.virtualtransaction = w.virtualtransaction
$function$;

DROP FUNCTION outbox_fence_proof_v1(bigint, bigint);
DROP TABLE outbox_fence_key;

DO $migrate$
BEGIN
    EXECUTE format('ALTER FUNCTION outbox_mark_publisher_v2() SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION outbox_publishers_v2() SET search_path = %I, pg_temp',
                   current_schema());
END
$migrate$;
