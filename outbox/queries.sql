-- name: prepared_transactions_allowed
-- A server setting, read as PostgreSQL reports it (no model covers it).
SELECT current_setting('max_prepared_transactions')::integer
