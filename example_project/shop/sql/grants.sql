-- Run by `make demo` as the owner after `migrate` (docs/roles.md, docs/outbox.md).
GRANT USAGE ON SCHEMA public TO {app}, {system};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {app};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {app};
REVOKE UPDATE, DELETE ON outbox_messages FROM {app};
GRANT SELECT, UPDATE, DELETE ON idempotency_keys TO {system};
GRANT SELECT, DELETE ON outbox_messages TO {system};
GRANT SELECT, INSERT, UPDATE ON consumer_offsets TO {system};
GRANT SELECT ON outbox_dead_letters TO {system};
GRANT SELECT, DELETE ON outbox_received TO {system};
