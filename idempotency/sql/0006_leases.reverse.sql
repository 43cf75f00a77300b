DROP TABLE idempotency_leases;
