-- A fence per tenant: a publishing transaction that stays open holds back only
-- its own tenants' later messages, and nothing outside a transaction that is
-- writing to the outbox can hold anything back (docs/guarantees.md, "Why no
-- message is skipped").
--
--   outbox_mark_publisher_v2()  the BEFORE INSERT trigger that gives every row
--                               its id. Before the id, it marks the transaction
--                               as a publisher in flight: a transaction-level
--                               shared advisory lock naming a bound below every
--                               id the transaction takes (once per transaction),
--                               and one naming the row's tenant (every row), or,
--                               when a key is held by someone else, a mark that
--                               holds back more.
--   outbox_publishers_v2()      the publishers in flight, per tenant, read from
--                               pg_locks: a transaction's marks count only while
--                               it holds the outbox's write lock (ROW EXCLUSIVE
--                               on outbox_messages), so a lock a session keeps
--                               after its transaction (a session-level advisory
--                               lock, left in a pooled server session) holds
--                               nothing back outside a writing transaction.
--   outbox_last_id_v2()         the last id handed out (read as the owner).
--   outbox_read_v2()            the last id handed out, the publishers in flight,
--                               then the next rows a reader may pass, read in a
--                               snapshot taken after both.
--   outbox_position_now_v2()    where a reader that skips the past starts.
--
-- A reader's position is the last id it passed, for every tenant but those
-- in consumer_offsets.held: {tenant: last id passed of that tenant}, each
-- below the position, kept while a publisher of that tenant was in flight.
--
-- Every function of this file carries a version in its name; a change of
-- signature or meaning is a new name, never an edit, so that processes of the
-- previous release keep what they call during a rolling deploy.
--
-- Readers of the previous release (outbox_read(), outbox_fence()) would ignore
-- the held tenants and skip their messages: those functions now refuse, with
-- a message naming the cause. Publishers of the previous release keep
-- working: they insert without an id, and the trigger gives it.

-- Publishers of the previous release may be in flight: their marks are the
-- old ones, which no new reader reads. Wait for them (an INSERT holds ROW
-- EXCLUSIVE until its transaction ends) and keep new ones out until the
-- trigger is in place; no reader may move meanwhile.
LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE;
LOCK TABLE consumer_offsets IN EXCLUSIVE MODE;

ALTER TABLE consumer_offsets ADD COLUMN held jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE consumer_offsets ADD CONSTRAINT consumer_offsets_held_is_an_object
    CHECK (jsonb_typeof(held) = 'object');

-- The mark of a transaction that may have published for any tenant: it holds
-- ROW EXCLUSIVE on this table, which has no rows, no columns and no privilege
-- for anyone but its owner, so that no other role can take or block the lock.
-- Used only when a tenant's mark cannot be taken (below).
CREATE TABLE outbox_publishing_any_tenant ();
REVOKE ALL ON outbox_publishing_any_tenant FROM PUBLIC;

CREATE FUNCTION outbox_mark_publisher_v2() RETURNS trigger
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

CREATE TRIGGER outbox_messages_mark_publisher
    BEFORE INSERT ON outbox_messages
    FOR EACH ROW EXECUTE FUNCTION outbox_mark_publisher_v2();

ALTER TABLE outbox_messages ALTER COLUMN id DROP DEFAULT;
DROP FUNCTION outbox_next_id();

-- The last id handed out (0: none yet), read as the sequence's owner: readers
-- need no privilege on it. Sequences are read outside MVCC: the value is the
-- current one, not a snapshot's.
CREATE FUNCTION outbox_last_id_v2() RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $function$
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END
      FROM outbox_message_ids AS s
$function$;

CREATE FUNCTION outbox_publishers_v2()
RETURNS TABLE (virtualtransaction text, pid integer, tenant_id bigint, bound bigint)
LANGUAGE sql VOLATILE
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

CREATE FUNCTION outbox_read_v2(after bigint, held jsonb, max_rows integer, topic_list text[],
                               part integer, parts integer)
RETURNS TABLE (allocated bigint, in_flight jsonb, message outbox_messages)
LANGUAGE plpgsql VOLATILE
AS $function$
DECLARE
    last_handed_out bigint;
    waiting jsonb;
    anyone_waiting boolean;
    caught_up_to bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'outbox_read_v2() needs READ COMMITTED, not %',
              current_setting('transaction_isolation')
              USING HINT = 'Its rows must be read in a snapshot taken after the publishers.';
    END IF;
    -- First the last id handed out: every id at or below it was taken before
    -- this point, by a transaction that had marked itself before that...
    last_handed_out := outbox_last_id_v2();
    -- ...then the publishers still in flight (prepared transactions included):
    -- per tenant, the lowest bound naming it ("*": a publisher for any tenant,
    -- whose bound caps every tenant). A mark of someone else's can only hold
    -- a tenant back longer, never pass a message.
    SELECT coalesce(jsonb_object_agg(coalesce(p.tenant_id::text, '*'), p.bound), '{}'::jsonb)
      INTO waiting
      FROM (SELECT o.tenant_id, min(o.bound) AS bound
              FROM outbox_publishers_v2() AS o GROUP BY o.tenant_id) AS p;
    anyone_waiting := waiting <> '{}'::jsonb;
    -- Under a publisher for any tenant, nothing passes its bound.
    last_handed_out := least(last_handed_out, (waiting ->> '*')::bigint);
    caught_up_to := least(after, last_handed_out);
    -- Statements of their own: under READ COMMITTED each takes a new snapshot,
    -- later than both. The rows after the position, and the rows of the held
    -- tenants between their own position and it, in id order.
    RETURN QUERY
        SELECT last_handed_out, waiting, r.m
          FROM (
                (SELECT m, m.id
                   FROM outbox_messages AS m
                  WHERE m.id > after AND m.id <= last_handed_out
                    AND (NOT anyone_waiting
                         OR m.id <= coalesce((waiting ->> m.tenant_id::text)::bigint, m.id))
                    AND (topic_list IS NULL OR m.topic = ANY (topic_list))
                    AND (parts = 1 OR mod(hashtextextended(coalesce(m.key, m.message_id::text), 0)
                                          & 9223372036854775807, parts) = part)
                  ORDER BY m.id
                  LIMIT max_rows)
                UNION ALL
                (SELECT c.m, c.id
                   FROM jsonb_each_text(held) AS h(tenant, upto)
                  CROSS JOIN LATERAL (
                        SELECT m, m.id
                          FROM outbox_messages AS m
                         WHERE m.tenant_id = h.tenant::bigint
                           AND m.id > h.upto::bigint AND m.id <= caught_up_to
                           AND (NOT anyone_waiting
                                OR m.id <= coalesce((waiting ->> m.tenant_id::text)::bigint, m.id))
                           AND (topic_list IS NULL OR m.topic = ANY (topic_list))
                           AND (parts = 1
                                OR mod(hashtextextended(coalesce(m.key, m.message_id::text), 0)
                                       & 9223372036854775807, parts) = part)
                         ORDER BY m.id
                         LIMIT max_rows) AS c)
               ) AS r(m, id)
         ORDER BY r.id
         LIMIT max_rows;
    IF NOT FOUND THEN
        RETURN QUERY SELECT last_handed_out, waiting, NULL::outbox_messages;
    END IF;
END
$function$;

-- The position of a reader that starts now and skips the past: every message
-- committed so far counts as passed, and every one still to commit does not
-- (the publishers in flight hold their tenants at their bounds). For a new
-- consumer that should not read history (docs/consumers.md).
CREATE FUNCTION outbox_position_now_v2()
RETURNS TABLE (last_id bigint, held jsonb)
LANGUAGE plpgsql VOLATILE
AS $function$
DECLARE
    last_handed_out bigint;
BEGIN
    last_handed_out := outbox_last_id_v2();
    RETURN QUERY
        SELECT least(last_handed_out, min(p.bound) FILTER (WHERE p.tenant_id IS NULL)),
               coalesce(jsonb_object_agg(p.tenant_id, p.bound)
                        FILTER (WHERE p.tenant_id IS NOT NULL AND p.bound < last_handed_out),
                        '{}'::jsonb)
          FROM (SELECT o.tenant_id, min(o.bound) AS bound
                  FROM outbox_publishers_v2() AS o GROUP BY o.tenant_id) AS p;
END
$function$;

-- The functions see this schema whatever the caller's search_path (and
-- pg_temp last, so that no temporary object can stand in for ours).
DO $migrate$
BEGIN
    EXECUTE format('ALTER FUNCTION outbox_mark_publisher_v2() SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION outbox_last_id_v2() SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION outbox_publishers_v2() SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION outbox_read_v2(bigint, jsonb, integer, text[], integer, integer)'
                   ' SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION outbox_position_now_v2() SET search_path = %I, pg_temp',
                   current_schema());
END
$migrate$;

-- The previous release's readers, refused: they would pass the held tenants'
-- messages by. Their signatures stay, so the refusal is what they meet.
CREATE OR REPLACE FUNCTION outbox_read(after_id bigint, max_rows integer, topic_list text[],
                                       part integer, parts integer)
RETURNS TABLE (fence bigint, message outbox_messages)
LANGUAGE plpgsql VOLATILE
AS $function$
BEGIN
    RAISE EXCEPTION 'outbox: this reader is of an earlier release of django-idempotency-outbox; the database was migrated past it (outbox 0008)'
          USING HINT = 'Run the relays and consumers of the release that migrated the database.';
END
$function$;

CREATE OR REPLACE FUNCTION outbox_fence() RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $function$
BEGIN
    RAISE EXCEPTION 'outbox: this reader is of an earlier release of django-idempotency-outbox; the database was migrated past it (outbox 0008)'
          USING HINT = 'Run the relays and consumers of the release that migrated the database.';
END
$function$;
