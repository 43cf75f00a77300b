-- outbox_publishers_v2() matches each tenant mark of a publisher with its
-- transaction id and its proof (0010). pg_locks comes back from a function
-- that PostgreSQL guesses at a thousand rows, so the planner joined the marks
-- to the locks in nested loops: one open transaction publishing for 10,000
-- tenants holds 20,000 advisory locks, and every read of every relay and
-- consumer scanned them 10,000 times over (15 s a read). Hash and merge joins
-- do the same matching in one pass over each side (0.1 s there); with the few
-- locks of ordinary traffic the two cost the same. JIT stays off: the one
-- nested loop left (the proof of each mark, a function of its row) makes the
-- plan's cost look vast, and compiling it took longer than running it.
ALTER FUNCTION outbox_publishers_v2() SET enable_nestloop = off;
ALTER FUNCTION outbox_publishers_v2() SET jit = off;
