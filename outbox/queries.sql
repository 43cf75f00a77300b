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
