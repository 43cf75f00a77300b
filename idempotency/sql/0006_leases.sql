-- Leases of the library's single-instance jobs (the key reaper), kept by the
-- database clock in a row, so that they hold through a transaction pooler: a
-- session advisory lock would stay on whichever server session the pooler
-- gave the job, and outlive the job. A lease is claimed, renewed and released
-- by statements that each commit on their own; a job that dies leaves a lease
-- that runs out. Shared (no tenant_id, no row-level security): only the
-- system role is granted it, and it holds no tenant's data.
CREATE TABLE idempotency_leases (
    name text PRIMARY KEY,
    owner text NOT NULL DEFAULT '',
    until timestamptz
);
INSERT INTO idempotency_leases (name) VALUES ('reaper');
