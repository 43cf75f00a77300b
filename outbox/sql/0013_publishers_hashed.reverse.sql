ALTER FUNCTION outbox_publishers_v2() RESET enable_nestloop;
ALTER FUNCTION outbox_publishers_v2() RESET jit;
