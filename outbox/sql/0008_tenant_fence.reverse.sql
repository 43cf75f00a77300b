-- Back to the single fence of 0003: every reader position that holds tenants
-- back moves back to the lowest of them (their messages and the others' after
-- it are delivered again: at least once, never skipped).

LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE;
LOCK TABLE consumer_offsets IN EXCLUSIVE MODE;

UPDATE consumer_offsets AS o
   SET last_id = least(o.last_id, (SELECT min(value::bigint) FROM jsonb_each_text(o.held)))
 WHERE o.held <> '{}'::jsonb;

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

ALTER TABLE outbox_messages ALTER COLUMN id SET DEFAULT outbox_next_id();
DROP TRIGGER outbox_messages_mark_publisher ON outbox_messages;
DROP FUNCTION outbox_mark_publisher_v2();
DROP FUNCTION outbox_read_v2(bigint, jsonb, integer, text[], integer, integer);
DROP FUNCTION outbox_position_now_v2();
DROP FUNCTION outbox_publishers_v2();
DROP FUNCTION outbox_last_id_v2();

CREATE OR REPLACE FUNCTION outbox_fence() RETURNS bigint
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

CREATE OR REPLACE FUNCTION outbox_read(after_id bigint, max_rows integer, topic_list text[],
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

-- The functions see this schema whatever the caller's search_path (pg_temp last).
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

ALTER TABLE consumer_offsets DROP COLUMN held;
