-- outbox_read_v2() with one scan along the ids, whatever the number of held
-- tenants (its signature and meaning are those of 0008, but for the publishers
-- in flight, now on the first row only: every reader reads them there).
--
-- 0008 read each held tenant's messages in a scan of its own (the primary key,
-- tenant_id then id), each up to the batch's size, and sorted the lot: with
-- 100 tenants held after a backlog of many-tenant transactions, 100 times the
-- rows a batch takes; with 10,000 tenants held at an open publisher's bound,
-- 10,000 probes on every read, though none of them could pass.
--
-- Now a held tenant still at its publisher's bound (its position is the bound:
-- nothing of it may be passed yet) is skipped outright, and the others are read
-- in the same scan as everyone else's messages, from the lowest of their
-- positions: a row below the reader's position is taken only when it is a held
-- tenant's, after that tenant's own position. The scan stops at the batch's
-- size; the rows it passes over were passed by the reader before, each read
-- once when its tenant is let go.

CREATE OR REPLACE FUNCTION outbox_read_v2(after bigint, held jsonb, max_rows integer,
                                          topic_list text[], part integer, parts integer)
RETURNS TABLE (allocated bigint, in_flight jsonb, message outbox_messages)
LANGUAGE plpgsql VOLATILE
AS $function$
DECLARE
    last_handed_out bigint;
    waiting jsonb;
    anyone_waiting boolean;
    lowest bigint;
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
    -- Where the scan starts: the reader's position, or the lowest position of
    -- a held tenant with something it may pass (below its publisher's bound,
    -- if one is still in flight, and below the last id handed out).
    SELECT least(after, min(h.upto::bigint))
      INTO lowest
      FROM jsonb_each_text(held) AS h(tenant, upto)
     WHERE h.upto::bigint < least(last_handed_out,
                                  coalesce((waiting ->> h.tenant)::bigint, last_handed_out));
    -- A statement of its own: under READ COMMITTED it takes a new snapshot,
    -- later than both. The rows after the position, and the rows of the held
    -- tenants after their own, in id order. The publishers in flight come with
    -- the first row only (readers read them there): with 10,000 tenants held
    -- they are 200 kB, and a copy on every row made a batch 200 MB.
    RETURN QUERY
        SELECT last_handed_out, CASE WHEN r.n = 1 THEN waiting END, r.m
          FROM (SELECT m, row_number() OVER (ORDER BY m.id) AS n
                  FROM outbox_messages AS m
                 WHERE m.id > lowest AND m.id <= last_handed_out
                   AND (m.id > after OR m.id > (held ->> m.tenant_id::text)::bigint)
                   AND (NOT anyone_waiting
                        OR m.id <= coalesce((waiting ->> m.tenant_id::text)::bigint, m.id))
                   AND (topic_list IS NULL OR m.topic = ANY (topic_list))
                   AND (parts = 1
                        OR mod(hashtextextended(coalesce(m.key, m.message_id::text), 0)
                               & 9223372036854775807, parts) = part)
                 ORDER BY m.id
                 LIMIT max_rows) AS r
         ORDER BY r.n;
    IF NOT FOUND THEN
        RETURN QUERY SELECT last_handed_out, waiting, NULL::outbox_messages;
    END IF;
END
$function$;

-- CREATE OR REPLACE resets the function's settings: it sees this schema again
-- whatever the caller's search_path (and pg_temp last).
DO $migrate$
BEGIN
    EXECUTE format('ALTER FUNCTION outbox_read_v2(bigint, jsonb, integer, text[], integer, integer)'
                   ' SET search_path = %I, pg_temp', current_schema());
END
$migrate$;
