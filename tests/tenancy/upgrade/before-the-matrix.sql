-- The grant lists of docs/roles.md and docs/outbox.md before the privilege
-- matrix (commit a80075c^), which a deployment ran by hand after migrate:
-- DML on every table for the app role, the sequences too, and the outbox's
-- own list. The worker role did not exist then; it has nothing here.
-- tests/tenancy/test_setup_upgrade.py puts a database in this state.
GRANT USAGE ON SCHEMA public TO dio_app, dio_system;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO dio_app;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO dio_app;
GRANT SELECT, UPDATE, DELETE ON idempotency_keys TO dio_system;
GRANT SELECT, INSERT, UPDATE, DELETE ON consumer_offsets, outbox_dead_letters,
      outbox_received TO dio_app;
GRANT SELECT, INSERT ON outbox_messages TO dio_app;
REVOKE UPDATE, DELETE ON outbox_messages FROM dio_app;
GRANT SELECT, DELETE ON outbox_messages TO dio_system;
GRANT SELECT, INSERT, UPDATE ON consumer_offsets TO dio_system;
GRANT SELECT ON outbox_dead_letters TO dio_system;
GRANT SELECT, DELETE ON outbox_received TO dio_system;
