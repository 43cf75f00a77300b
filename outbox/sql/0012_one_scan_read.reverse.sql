-- Back to 0008's outbox_read_v2(): a scan per held tenant.

CREATE OR REPLACE FUNCTION outbox_read_v2(after bigint, held jsonb, max_rows integer, topic_list text[],
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

DO $migrate$
BEGIN
    EXECUTE format('ALTER FUNCTION outbox_read_v2(bigint, jsonb, integer, text[], integer, integer)'
                   ' SET search_path = %I, pg_temp', current_schema());
END
$migrate$;
