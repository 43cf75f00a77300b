-- The publisher fence: readers follow the stream in id order, and only a
-- transaction that has published and is still open can hold them back
-- (docs/guarantees.md, "Why no message is skipped").
--
--   outbox_next_id()  the id of every new row. Before it takes the id, it takes
--                     a transaction-level shared advisory lock whose key names a
--                     lower bound of every id its transaction takes: the
--                     publisher's mark in pg_locks.
--   outbox_fence()    the first id a reader may not read yet: the last id handed
--                     out, or the lowest bound of a publisher still in flight.
--   outbox_read()     the next rows below the fence, read in a snapshot taken
--                     after the fence.
--
-- Readers' positions become the last id passed; a position kept in the old
-- (xid, id) order is converted where that is exact, and the migration refuses
-- where it is not.

-- No publisher may be in flight while positions are converted (every open
-- INSERT holds ROW EXCLUSIVE until its transaction ends), and no reader may
-- move. (The ALTER TABLE below would take the same lock; taking it first says so.)
LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE;
LOCK TABLE consumer_offsets IN EXCLUSIVE MODE;

-- The conversion below must see every tenant's messages: FORCE applies the
-- policy to the owner too, so it is lifted for this transaction only (no one
-- else can read the table until it commits) and restored at the end.
ALTER TABLE outbox_messages NO FORCE ROW LEVEL SECURITY;

-- Ids from a sequence of their own. CACHE 1 (no values kept by sessions) makes
-- nextval hand out increasing values over time across all sessions, which the
-- fence relies on; NO CYCLE keeps them increasing. It carries on where the
-- identity stopped, and TRUNCATE ... RESTART IDENTITY restarts it (OWNED BY).
CREATE SEQUENCE outbox_message_ids AS bigint INCREMENT BY 1 NO CYCLE CACHE 1
    OWNED BY outbox_messages.id;

DO $migrate$
DECLARE
    last bigint;
    called boolean;
BEGIN
    EXECUTE format('SELECT last_value, is_called FROM %s',
                   pg_get_serial_sequence('outbox_messages', 'id'))
       INTO last, called;
    PERFORM setval('outbox_message_ids', last, called);
    IF (SELECT seqcache FROM pg_sequence WHERE seqrelid = 'outbox_message_ids'::regclass) <> 1 THEN
        RAISE EXCEPTION 'outbox: the sequence outbox_message_ids must have CACHE 1';
    END IF;
END
$migrate$;

-- The key of a publisher's lock: the two-int4 form (objsubid 2 in pg_locks),
-- with the tag 28514 (0x6F62) in the high 16 bits of the first key and the
-- bound's upper 16 bits below it, the bound's lower 32 bits in the second
-- key. Bounds above 2^48 - 1 are written as 2^48 - 1: lower, so still safe.
CREATE FUNCTION outbox_next_id() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $function$
DECLARE
    -- Remembered per transaction in a transaction-local setting, which the
    -- database reverts exactly when it releases the lock taken with it: at
    -- the end of the transaction, and at the rollback of the savepoint in
    -- which both were first taken.
    remembered bigint := nullif(current_setting('outbox.publisher_bound', true), '')::bigint;
    bound bigint;
BEGIN
    -- The last id handed out so far (sequences are read outside MVCC): every
    -- id this transaction takes from now on is larger.
    SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END
      INTO bound FROM outbox_message_ids;
    IF remembered IS NULL THEN
        bound := least(bound, 281474976710655);
        PERFORM set_config('outbox.publisher_bound', bound::text, true);
    ELSE
        -- Any role may set the setting: a remembered bound is only trusted up
        -- to the last id handed out, so a forged, larger one cannot name a
        -- bound above the id taken below (a smaller one only holds the
        -- fence lower while this transaction is open).
        bound := least(remembered, bound);
    END IF;
    -- Taken again for every row (a held lock only counts up, in this backend):
    -- the row and the lock are then taken in the same savepoint, so a row
    -- that survives always has a lock that survives with it.
    PERFORM pg_advisory_xact_lock_shared(1868693504 | (bound >> 32)::integer,
                                         (bound & 4294967295)::bit(32)::integer);
    RETURN nextval('outbox_message_ids');
END
$function$;

CREATE FUNCTION outbox_fence() RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $function$
DECLARE
    allocated bigint;
    lowest bigint;
BEGIN
    -- First the last id handed out: every id at or below it was taken before
    -- this point, by a transaction that took its lock before that...
    SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END
      INTO allocated FROM outbox_message_ids;
    -- ...then the publishers still in flight (prepared transactions included),
    -- each holding a lock that names a bound below every id it took. A lock of
    -- someone else's with the same tag can only lower the fence.
    SELECT min(((l.classid::bigint & 65535) << 32) | l.objid::bigint)
      INTO lowest
      FROM pg_locks AS l
     WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
       AND l.classid::bigint >> 16 = 28514
       AND l.database = (SELECT d.oid FROM pg_database AS d
                          WHERE d.datname = current_database());
    RETURN least(allocated, lowest) + 1;
END
$function$;

CREATE FUNCTION outbox_read(after_id bigint, max_rows integer, topic_list text[],
                            part integer, parts integer)
RETURNS TABLE (fence bigint, message outbox_messages)
LANGUAGE plpgsql VOLATILE
AS $function$
DECLARE
    first_unreadable bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'outbox_read() needs READ COMMITTED, not %',
              current_setting('transaction_isolation')
              USING HINT = 'Its rows must be read in a snapshot taken after the fence.';
    END IF;
    first_unreadable := outbox_fence();
    -- A statement of its own: under READ COMMITTED it takes a new snapshot,
    -- later than the fence.
    RETURN QUERY
        SELECT first_unreadable, m
          FROM outbox_messages AS m
         WHERE m.id > after_id AND m.id < first_unreadable
           AND (topic_list IS NULL OR m.topic = ANY (topic_list))
           AND (parts = 1 OR mod(hashtextextended(coalesce(m.key, m.message_id::text), 0)
                                 & 9223372036854775807, parts) = part)
         ORDER BY m.id
         LIMIT max_rows;
    IF NOT FOUND THEN
        RETURN QUERY SELECT first_unreadable, NULL::outbox_messages;
    END IF;
END
$function$;

-- The functions see this schema whatever the caller's search_path (and
-- pg_temp last, so that no temporary object can stand in for ours).
DO $migrate$
BEGIN
    EXECUTE format('ALTER FUNCTION outbox_next_id() SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION outbox_fence() SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION outbox_read(bigint, integer, text[], integer, integer)'
                   ' SET search_path = %I, pg_temp', current_schema());
END
$migrate$;

-- The id order needs an index on id alone. Like the one it replaces, it does
-- not start with tenant_id (the delivery order is global) and is not unique.
CREATE INDEX outbox_messages_delivery_by_id ON outbox_messages (id);

-- Positions: from (last_xid, last_id) in (xid, id) order to the last id passed.
-- A reader at (x, i) has passed exactly the messages at or before (x, i). In
-- id order that is a position only if every message it passed has a smaller
-- id than every message it has not: then the new position is the id just
-- below the first message not passed (or the last id handed out, when it has
-- passed them all). Otherwise there is no such position: converting would
-- either deliver some messages again or skip some, so the migration refuses.
DO $migrate$
DECLARE
    reader record;
    allocated bigint;
    first_unpassed bigint;
    old_head bigint;
    straddling bigint;
BEGIN
    SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END
      INTO allocated FROM outbox_message_ids;
    FOR reader IN
        SELECT name, partition, last_xid, last_id FROM consumer_offsets
         ORDER BY name, partition
    LOOP
        SELECT min(m.id) INTO first_unpassed FROM outbox_messages AS m
         WHERE (m.xid, m.id) > (reader.last_xid, reader.last_id);
        SELECT m.id INTO straddling FROM outbox_messages AS m
         WHERE m.id > first_unpassed AND (m.xid, m.id) <= (reader.last_xid, reader.last_id)
         ORDER BY m.id LIMIT 1;
        IF straddling IS NOT NULL THEN
            RAISE EXCEPTION 'outbox: reader % (partition %) has passed message % but not message %, which has a smaller id, so its position has no equivalent in id order: run the relays and consumers of the previous release until they have caught up, stop them all, then migrate again', reader.name, reader.partition, straddling, first_unpassed;
        END IF;
        -- A failing head's count belongs to the first message not passed in
        -- (xid, id) order; if another message comes first in id order, the
        -- count starts afresh (the failing message fails again if it must).
        SELECT m.id INTO old_head FROM outbox_messages AS m
         WHERE (m.xid, m.id) > (reader.last_xid, reader.last_id)
         ORDER BY m.xid, m.id LIMIT 1;
        UPDATE consumer_offsets
           SET last_id = coalesce(first_unpassed - 1, allocated),
               attempts = CASE WHEN old_head = first_unpassed THEN attempts ELSE 0 END,
               retry_at = CASE WHEN old_head = first_unpassed THEN retry_at END,
               last_error = CASE WHEN old_head = first_unpassed THEN last_error ELSE '' END,
               -- relays are stopped; a lease left by one would only delay the next
               lease_owner = '', lease_until = NULL
         WHERE name = reader.name AND partition = reader.partition;
    END LOOP;
END
$migrate$;

DROP INDEX outbox_messages_delivery;
ALTER INDEX outbox_messages_delivery_by_id RENAME TO outbox_messages_delivery;

-- Positions no longer have an xid half; dropping it also stops a reader of the
-- previous release that was left running from reading with a converted position.
ALTER TABLE consumer_offsets DROP COLUMN last_xid;

ALTER TABLE outbox_messages ALTER COLUMN id DROP IDENTITY;
ALTER TABLE outbox_messages ALTER COLUMN id SET DEFAULT outbox_next_id();

ALTER TABLE outbox_messages FORCE ROW LEVEL SECURITY;
