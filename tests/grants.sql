-- What docs/roles.md grants, run by the owner after `migrate` (the test
-- harness formats {app} and {system} with the roles of the two aliases).
GRANT USAGE ON SCHEMA public TO {app}, {system};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {app};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {app};
-- The system role reaches only the library's own tables.
GRANT SELECT, UPDATE, DELETE ON idempotency_keys TO {system};
-- outbox: messages are append-only for the app role; the system role reads the
-- stream across tenants, keeps the relay's offset, and reaps.
REVOKE UPDATE, DELETE ON outbox_messages FROM {app};
GRANT SELECT, DELETE ON outbox_messages TO {system};
GRANT SELECT, INSERT, UPDATE ON consumer_offsets TO {system};
GRANT SELECT ON outbox_dead_letters TO {system};
GRANT SELECT, DELETE ON outbox_received TO {system};
