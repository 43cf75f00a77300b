-- Autovacuum for a table whose every row is inserted once and deleted once:
-- PostgreSQL's defaults wait for dead rows a fifth of the table's size, so a
-- table of ten million keys would carry two million dead ones between runs.
-- These vacuum it after about a hundredth (docs/scaling.md, "Idempotency
-- keys"; measured by make bench-scale's churn step). ALTER TABLE ... SET takes
-- a lock that reads and writes do not wait for.
ALTER TABLE idempotency_keys SET (
    autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 1);
