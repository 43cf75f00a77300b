DROP FUNCTION idempotency_store(bigint, text, text, text, text, text, text, integer, bytea, jsonb,
                                interval);
DROP FUNCTION idempotency_lookup(bigint, text, text, bigint);
