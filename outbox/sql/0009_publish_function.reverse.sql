DROP FUNCTION outbox_publish(bigint, uuid, text, text, text, text, jsonb, jsonb);
