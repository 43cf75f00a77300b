-- publish()'s INSERT, as a function. PL/pgSQL keeps the plan of the statement
-- for the life of the server session that runs it, through a transaction
-- pooler as well as on a direct connection; unlike a prepared statement, the
-- plan belongs to the function, which only the tables' owner can change, so
-- nothing that ran on the session before can stand in for it. It runs with the
-- caller's rights (SECURITY INVOKER): row-level security and the fence's
-- trigger (outbox_mark_publisher_v2(), which gives the id and marks the
-- transaction) apply as to the INSERT itself.
CREATE FUNCTION outbox_publish(p_tenant_id bigint, p_message_id uuid, p_topic text, p_key text,
                               p_aggregate_type text, p_aggregate_id text, p_payload jsonb,
                               p_headers jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $function$
BEGIN
    INSERT INTO outbox_messages
           (tenant_id, message_id, topic, key, aggregate_type, aggregate_id, payload, headers)
    VALUES (p_tenant_id, p_message_id, p_topic, p_key, p_aggregate_type, p_aggregate_id,
            p_payload, p_headers);
END
$function$;
