-- Every statement the outbox app sends at run time, by name (loaded by
-- django_idempotency_outbox.sqlfiles.queries("outbox")). Each is written by
-- hand for the reason beside it; what gains nothing from SQL of its own uses
-- the ORM (outbox/store.py). What may be read is decided in one place, the
-- SQL functions of outbox/sql/0008_tenant_fence.sql (outbox_read_v2() and the
-- publishers in flight it reads); outbox.store.read_batch says why it is safe.

-- name: publish
-- One round trip on the caller's hot path (outbox_publish(), migration 0009:
-- planned once per server session). The trigger outbox_mark_publisher_v2()
-- marks the transaction as a publisher in flight for the row's tenant (the
-- fence) before it gives the id.
SELECT outbox_publish(%(tenant_id)s, %(message_id)s, %(topic)s, %(key)s, %(aggregate_type)s,
                      %(aggregate_id)s, %(payload)s::jsonb, %(headers)s::jsonb)

-- name: read_messages
-- The gap-safe read: outbox_read_v2() reads the last id handed out and the
-- publishers in flight, then the rows in a snapshot of its own, taken after
-- both, in one round trip (one SELECT could not: its snapshot is taken before
-- anything in it runs). It returns the first two alone when no row matches; m
-- is each row's columns.
SELECT r.allocated, r.in_flight::text,
       m.id, m.message_id, m.tenant_id, m.topic, m.payload, m.key, m.aggregate_type,
       m.aggregate_id, m.headers, m.created_at, m.xid::text
  FROM outbox_read_v2(%(after)s, %(held)s::jsonb, %(limit)s, %(topics)s, %(partition)s,
                      %(partitions)s) AS r
 CROSS JOIN LATERAL (SELECT (r.message).*) AS m

-- name: read_envelopes
-- The same read, each message as its envelope: PostgreSQL writes the JSON in
-- the same statement and snapshot, so that the relay passes payloads through
-- as text, never decoding and encoding them again. The keys are
-- outbox.stream.ENVELOPE_KEYS, in order; headers are {} for SQL NULL and JSON
-- null alike; created_at is in UTC as datetime.isoformat() writes it (no
-- fraction when it is zero).
SELECT r.allocated, r.in_flight::text,
       m.id, m.xid::text, m.message_id::text, m.topic,
       json_build_object(
           'id', m.id, 'message_id', m.message_id, 'tenant_id', m.tenant_id,
           'topic', m.topic, 'key', m.key, 'aggregate_type', m.aggregate_type,
           'aggregate_id', m.aggregate_id, 'payload', m.payload,
           'headers', coalesce(nullif(m.headers, 'null'::jsonb), '{}'::jsonb),
           'created_at', to_char(m.created_at AT TIME ZONE 'UTC',
               CASE WHEN extract(microseconds FROM m.created_at)::bigint %% 1000000 = 0
                    THEN 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"'
                    ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"' END))::text
  FROM outbox_read_v2(%(after)s, %(held)s::jsonb, %(limit)s, NULL, 0, 1) AS r
 CROSS JOIN LATERAL (SELECT (r.message).*) AS m

-- name: partition_counts
-- The partition counts a consumer's offset rows were made with (DISTINCT).
SELECT DISTINCT partition_count FROM consumer_offsets WHERE name = %(name)s

-- name: create_offsets
-- Every partition in one statement; the row count says how many were new
-- (bulk_create(ignore_conflicts=True) cannot tell).
INSERT INTO consumer_offsets (name, partition, partition_count)
SELECT %(name)s, p, %(partitions)s FROM generate_series(0, %(partitions)s - 1) AS p
ON CONFLICT (name, partition) DO NOTHING

-- name: lock_offset
-- SKIP LOCKED (another worker has the partition: move on), and the clock
-- comparisons made by the database, on the consumer's hot path.
SELECT last_id, held::text, attempts, coalesce(retry_at > now(), false),
       coalesce(last_processed_at < now() - interval '5 seconds', true)
  FROM consumer_offsets
 WHERE name = %(name)s AND partition = %(partition)s
   FOR UPDATE SKIP LOCKED

-- name: lock_offset_watching_client
-- The same lock, and while the batch holds it the server notices at once a
-- client host that is gone (no FIN: a power cut, a lost network), so that the
-- lock is released and another worker takes the partition: TCP keepalives
-- every second after a second of silence, a limit on unacknowledged data, and
-- checks of the socket while a statement runs (PostgreSQL 14+). For the
-- batch's transaction only (set_config(..., true)), in the statement that
-- takes the lock (no round trip of its own); the database restores the
-- previous values at COMMIT or ROLLBACK.
SELECT last_id, held::text, attempts, coalesce(retry_at > now(), false),
       coalesce(last_processed_at < now() - interval '5 seconds', true),
       set_config('tcp_keepalives_idle', '1', true),
       set_config('tcp_keepalives_interval', '1', true),
       set_config('tcp_keepalives_count', %(count)s, true),
       set_config('tcp_user_timeout', %(timeout_ms)s, true),
       set_config('client_connection_check_interval', '1000', true)
  FROM consumer_offsets
 WHERE name = %(name)s AND partition = %(partition)s
   FOR UPDATE SKIP LOCKED

-- name: advance_offset
-- Once per batch on the consumer's hot path; retry_at by the database clock.
UPDATE consumer_offsets
   SET last_id = %(last_id)s, held = %(held)s::jsonb, last_processed_at = now(),
       attempts = %(attempts)s, retry_at = now() + make_interval(secs => %(retry_in)s)
 WHERE name = %(name)s AND partition = %(partition)s

-- name: record_failure
-- One upsert per failure, as the failing message's tenant.
INSERT INTO outbox_consumer_failures
       (tenant_id, consumer, partition, message_pk, message_id, attempts, error)
VALUES (%(tenant_id)s, %(consumer)s, %(partition)s, %(message_pk)s, %(message_id)s,
        %(attempts)s, %(error)s)
ON CONFLICT (tenant_id, consumer, partition) DO UPDATE
   SET message_pk = excluded.message_pk, message_id = excluded.message_id,
       attempts = excluded.attempts, error = excluded.error, failed_at = now()

-- name: claim_lease
-- The relay's lease lives on its offset row (partition 0), so that a claim
-- returns the position in the same round trip (tenancy.leases): taken when
-- free, run out, or already this owner's, by the database clock.
UPDATE consumer_offsets
   SET lease_owner = %(owner)s, lease_until = now() + make_interval(secs => %(seconds)s)
 WHERE name = %(name)s AND partition = 0
   AND (lease_owner = %(owner)s OR lease_until IS NULL OR lease_until < now())
RETURNING last_id, held::text

-- name: renew_lease
-- Only while it is still this owner's. The commit does not wait for the WAL
-- flush: a renewal lost in a crash costs nothing, and a slow flush must not
-- make a live holder miss its renewal.
UPDATE consumer_offsets
   SET lease_until = now() + make_interval(secs => %(seconds)s)
  FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async
 WHERE name = %(name)s AND partition = 0 AND lease_owner = %(owner)s

-- name: release_lease
-- Given up at once, so that another relay takes over without waiting.
UPDATE consumer_offsets SET lease_until = NULL, lease_owner = ''
 WHERE name = %(name)s AND partition = 0 AND lease_owner = %(owner)s

-- name: advance_leased
-- The relay's advance: a compare-and-set on the old position and the lease's
-- owner, in one statement.
UPDATE consumer_offsets
   SET last_id = %(last_id)s, held = %(held)s::jsonb, last_processed_at = now()
 WHERE name = %(name)s AND partition = 0 AND last_id = %(expected_last_id)s
   AND held = %(expected_held)s::jsonb AND lease_owner = %(owner)s

-- name: mark_of_message
-- Rewinding: the position just before a message is its id - 1 in the id
-- delivery order. There is no index on message_id: an operator's one-off
-- lookup scans the outbox.
-- Across tenants: an operator's rewind of the relay, which passes every tenant's messages.
SELECT m.id - 1, m.message_id, m.created_at FROM outbox_messages AS m
 WHERE m.message_id = %(message_id)s

-- name: first_mark_since
-- Rewinding: the first message in delivery order published at or after a
-- time, along the delivery index. created_at is each transaction's start,
-- not the delivery order (a transaction that started earlier may take a
-- larger id), hence "first in order": every message published since has an
-- id at least this one's.
-- Across tenants: an operator's rewind of the relay, which passes every tenant's messages.
SELECT m.id - 1, m.message_id, m.created_at FROM outbox_messages AS m
 WHERE m.created_at >= %(since)s ORDER BY m.id LIMIT 1

-- name: oldest_mark
-- Rewinding: the oldest message still kept.
-- Across tenants: an operator's rewind of the relay, which passes every tenant's messages.
SELECT m.id - 1, m.message_id, m.created_at FROM outbox_messages AS m
 ORDER BY m.created_at LIMIT 1

-- name: count_between
-- Rewinding: the messages a reader moved back to after reads again (those
-- after it that the position had passed), per topic, along the delivery index.
-- Across tenants: an operator's rewind of the relay, which passes every tenant's messages.
SELECT m.topic, count(*) FROM outbox_messages AS m
 WHERE m.id > %(after)s AND m.id <= %(upto)s
   AND m.id <= coalesce((%(held)s::jsonb ->> m.tenant_id::text)::bigint, m.id)
 GROUP BY m.topic ORDER BY m.topic

-- name: set_relay_position
-- Rewinding: only backwards (a forward move would skip messages), and the
-- lease is dropped. A relay that holds it notices either way: its heartbeat
-- finds the lease no longer its own (it claims again, which returns this
-- position), and its compare-and-set on the old position and its lease fails
-- if it tries to advance first.
UPDATE consumer_offsets
   SET last_id = %(position)s, last_processed_at = now(),
       held = (SELECT coalesce(jsonb_object_agg(h.tenant, h.upto), '{}'::jsonb)
                 FROM jsonb_each(held) AS h(tenant, upto)
                WHERE h.upto::bigint < %(position)s),
       lease_owner = '', lease_until = NULL
 WHERE name = %(name)s AND partition = 0 AND last_id > %(position)s

-- name: database_now
-- The database clock (every time comparison of the library uses it).
SELECT now()

-- name: park
-- The dead letter's id comes from an identity the model does not know (the
-- ORM would insert NULL).
INSERT INTO outbox_dead_letters
       (tenant_id, consumer, message_pk, message_id, topic, key, aggregate_type,
        aggregate_id, payload, headers, message_created_at, attempts, error)
VALUES (%(tenant_id)s, %(consumer)s, %(message_pk)s, %(message_id)s, %(topic)s, %(key)s,
        %(aggregate_type)s, %(aggregate_id)s, %(payload)s::jsonb, %(headers)s::jsonb,
        %(created_at)s, %(attempts)s, %(error)s)

-- name: delete_passed_messages
-- Retention: a bounded batch along the delivery index, up to a position
-- (DELETE has no LIMIT).
-- Across tenants: retention (the system role), along the one delivery order of every tenant.
DELETE FROM outbox_messages
 WHERE (tenant_id, id) IN (
        SELECT tenant_id, id FROM outbox_messages
         WHERE id <= %(upto)s AND created_at < now() - make_interval(secs => %(older_than)s)
         ORDER BY id
         LIMIT %(limit)s)

-- name: delete_received
-- Retention: a bounded batch of one tenant's receiver records along
-- (tenant_id, received_at).
DELETE FROM outbox_received
 WHERE (tenant_id, receiver, message_id) IN (
        SELECT tenant_id, receiver, message_id FROM outbox_received
         WHERE tenant_id = %(tenant_id)s
           AND received_at < now() - make_interval(secs => %(older_than)s)
         LIMIT %(limit)s)

-- name: reader_states
-- Status: per reader, along the delivery index and the held tenants'
-- (tenant_id, id) ranges, the committed messages it has not passed, the first
-- of them in delivery order (its age by the database clock, and its tenant),
-- the head's failure, and the lease by the database clock. The messages not
-- passed are counted up to 10,000 per range, so that a check costs the same
-- whatever the backlog; past that, the ids handed out since the position (rolled-back ones
-- too: never fewer than the messages).
-- Across tenants: status and health (the system role): every reader's place in
-- the one delivery order.
SELECT o.name, o.partition, o.partition_count, o.last_id, o.held::text,
       (SELECT CASE WHEN count(*) > 10000 THEN outbox_last_id_v2() - o.last_id
                    ELSE count(*) END
          FROM (SELECT FROM outbox_messages AS m WHERE m.id > o.last_id LIMIT 10001) AS c)
         + coalesce((SELECT sum((SELECT CASE WHEN count(*) > 10000
                                             THEN o.last_id - h.upto::bigint ELSE count(*) END
                                  FROM (SELECT FROM outbox_messages AS m
                                         WHERE m.tenant_id = h.tenant::bigint
                                           AND m.id > h.upto::bigint AND m.id <= o.last_id
                                         LIMIT 10001) AS c))
                       FROM jsonb_each_text(o.held) AS h(tenant, upto)), 0),
       now() - first.created_at, first.tenant_id,
       now() - o.last_processed_at, o.attempts, f.error, f.tenant_id,
       extract(epoch FROM o.lease_until - now())::float8, o.lease_owner
  FROM consumer_offsets AS o
  LEFT JOIN LATERAL (
       SELECT x.created_at, x.tenant_id FROM (
              (SELECT m.id, m.created_at, m.tenant_id FROM outbox_messages AS m
                WHERE m.id > o.last_id ORDER BY m.id LIMIT 1)
              UNION ALL
              (SELECT c.id, c.created_at, c.tenant_id
                 FROM jsonb_each_text(o.held) AS h(tenant, upto)
                CROSS JOIN LATERAL (
                      SELECT m.id, m.created_at, m.tenant_id FROM outbox_messages AS m
                       WHERE m.tenant_id = h.tenant::bigint
                         AND m.id > h.upto::bigint AND m.id <= o.last_id
                       ORDER BY m.id LIMIT 1) AS c)
            ) AS x
        ORDER BY x.id LIMIT 1) AS first ON true
  LEFT JOIN LATERAL (
       SELECT f.error, f.tenant_id FROM outbox_consumer_failures AS f
        WHERE f.consumer = o.name AND f.partition = o.partition
          AND f.message_pk > coalesce((o.held ->> f.tenant_id::text)::bigint, o.last_id)
        ORDER BY f.failed_at DESC LIMIT 1) AS f ON o.attempts > 0
 ORDER BY o.name, o.partition

-- name: last_allocated
-- The last id handed out (0: none yet).
SELECT outbox_last_id_v2()

-- name: publishers
-- Status: the publishers in flight, found by their marks as the reads find
-- them (outbox_publishers_v2(): pg_locks shows every backend's locks to every
-- role); pg_stat_activity shows other roles' query, state and start only to
-- pg_read_all_stats. A prepared transaction has no backend: its
-- transaction-id lock, under the same virtual transaction, leads to its gid.
-- Each publisher's waiting messages are counted along (tenant_id, id).
-- Across tenants: status (the system role): the publishers in flight, whoever their tenants.
WITH p AS (
    SELECT o.virtualtransaction, o.pid,
           coalesce(array_agg(DISTINCT o.tenant_id) FILTER (WHERE o.tenant_id IS NOT NULL),
                    '{}') AS tenants,
           bool_or(o.tenant_id IS NULL) AS any_tenant, min(o.bound) AS bound
      FROM outbox_publishers_v2() AS o
     GROUP BY o.virtualtransaction, o.pid
)
SELECT p.pid, p.tenants, p.any_tenant, p.bound,
       coalesce(a.xact_start, x.prepared),
       CASE WHEN p.pid IS NULL THEN 'prepared' ELSE a.state END,
       coalesce(a.query, x.gid), coalesce(a.usename, x.owner), a.application_name,
       (SELECT count(*) FROM outbox_messages AS m
         WHERE (p.any_tenant OR m.tenant_id = ANY (p.tenants)) AND m.id > p.bound),
       now()
  FROM p
  LEFT JOIN pg_stat_activity AS a ON a.pid = p.pid
  LEFT JOIN LATERAL (
       SELECT x.gid, x.prepared, x.owner
         FROM pg_locks AS t JOIN pg_prepared_xacts AS x ON x.transaction = t.transactionid
        WHERE p.pid IS NULL AND t.pid IS NULL AND t.locktype = 'transactionid'
          AND t.virtualtransaction = p.virtualtransaction
        LIMIT 1) AS x ON true
 ORDER BY p.bound, p.pid NULLS FIRST

-- name: count_waiting
-- Status: the committed messages above the lowest bound of a publisher for any
-- tenant (if one is in flight), and, below it, per tenant held back, those
-- above the lowest bound naming it, along (tenant_id, id); each range counted
-- up to 10,000, then by the ids handed out in it, as reader_states does.
-- Across tenants: status (the system role): what every publisher in flight holds back.
SELECT (SELECT CASE WHEN count(*) > 10000 THEN outbox_last_id_v2() - %(everyone)s
                    ELSE count(*) END
          FROM (SELECT FROM outbox_messages AS m WHERE m.id > %(everyone)s LIMIT 10001) AS c)
       + coalesce(sum((SELECT CASE WHEN count(*) > 10000
                                   THEN least(%(everyone)s, outbox_last_id_v2()) - w.bound
                                   ELSE count(*) END
                         FROM (SELECT FROM outbox_messages AS m
                                WHERE m.tenant_id = w.tenant AND m.id > w.bound
                                  AND m.id <= %(everyone)s LIMIT 10001) AS c)), 0)
  FROM unnest(%(tenants)s::bigint[], %(bounds)s::bigint[]) AS w(tenant, bound)

-- name: record_received
-- A receiver's de-duplication: one statement both records the id and says
-- whether it was new; concurrent duplicates wait on the primary key
-- (get_or_create would need a savepoint and a second statement).
INSERT INTO outbox_received (tenant_id, receiver, message_id)
VALUES (%(tenant_id)s, %(receiver)s, %(message_id)s)
ON CONFLICT DO NOTHING

-- name: fence_facts
-- The system checks: what the fence rests on, from the catalogs (no model
-- covers them). None before migration 0003.
SELECT s.seqcache, s.seqincrement, s.seqcycle,
       (SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef AS d
         WHERE d.adrelid = 'outbox_messages'::regclass
           AND d.adnum = (SELECT attnum FROM pg_attribute
                           WHERE attrelid = 'outbox_messages'::regclass AND attname = 'id')),
       (SELECT max(t.tgenabled) FROM pg_trigger AS t
         WHERE t.tgrelid = 'outbox_messages'::regclass
           AND t.tgfoid = to_regprocedure('outbox_mark_publisher_v2()')
           AND t.tgtype & 7 = 7),  -- ROW, BEFORE, INSERT
       to_regprocedure('outbox_mark_publisher_v2()') IS NOT NULL
  FROM pg_sequence AS s
 WHERE s.seqrelid = to_regclass('outbox_message_ids')

-- name: replication_slot
-- Hand-written: pg_replication_slots is a view of the server's own, and its
-- catalog_xmin is a 32-bit xid; it is turned into the xid8 that
-- outbox_messages.xid holds (the epoch of the next xid, one less when the
-- slot's xid is above the next one's lower 32 bits: it is never more than
-- 2^31 transactions old).
SELECT s.active, s.wal_status,
       CASE WHEN s.catalog_xmin IS NULL THEN NULL
            WHEN ((n.next >> 32) << 32 | s.catalog_xmin::text::bigint) > n.next
            THEN ((n.next >> 32) << 32 | s.catalog_xmin::text::bigint) - 4294967296
            ELSE ((n.next >> 32) << 32 | s.catalog_xmin::text::bigint) END,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint
  FROM pg_replication_slots AS s
 CROSS JOIN (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next) AS n
 WHERE s.slot_name = %(slot)s AND s.database = current_database()

-- name: delete_decoded_messages
-- Across tenants: retention's batch (the system role), as outbox.store's
-- delete of passed messages, limited to the transactions a replication slot
-- has passed. A bounded batch along the delivery index (DELETE has no LIMIT).
DELETE FROM outbox_messages
 WHERE (tenant_id, id) IN (
        SELECT tenant_id, id FROM outbox_messages
         WHERE id <= %(upto)s
           AND xid < %(passed_before)s::xid8
           AND created_at < now() - make_interval(secs => %(older_than)s)
         ORDER BY id
         LIMIT %(limit)s)

-- name: role_powers
-- The catalog: what the role this alias connects as may do about another
-- role's session (pg_stat_activity hides its query and start without
-- pg_read_all_stats; pg_terminate_backend() needs a superuser, a member of
-- pg_signal_backend, or a member of the session's own role). No model maps
-- pg_roles, and pg_has_role() is a function.
SELECT current_user::text, r.rolsuper,
       pg_has_role('pg_signal_backend', 'MEMBER'),
       pg_has_role('pg_read_all_stats', 'MEMBER'),
       coalesce(pg_has_role(current_user, h.oid, 'MEMBER'), false)
  FROM pg_roles AS r
  LEFT JOIN pg_roles AS h ON h.rolname = %(holder)s
 WHERE r.rolname = current_user

-- name: prepared_transactions_allowed
-- A server setting, read as PostgreSQL reports it (no model covers it).
SELECT current_setting('max_prepared_transactions')::integer
