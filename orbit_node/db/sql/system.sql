-- name: ping
SELECT 1 AS ok

-- name: db_now
SELECT NOW(6) AS now

-- name: node_register
INSERT INTO nodes (node_id, hostname, http_addr, version, schema_head)
VALUES (%(node_id)s, %(hostname)s, %(http_addr)s, %(version)s, %(schema_head)s)

-- name: node_heartbeat
UPDATE nodes SET heartbeat_at = NOW(6) WHERE node_id = %(node_id)s

-- name: node_stopped
UPDATE nodes SET stopped_at = NOW(6), heartbeat_at = NOW(6) WHERE node_id = %(node_id)s

-- The server of a multi-host DSN that every node writes to (db/hosts.py). Read by the
-- pool on each new connection, with wsrep_sync_wait=1; written by a node that moved
-- because its server was lost, and by `orbit-admin database writer --host`.
-- name: database_writer_read
SELECT host, changed_by, changed_at FROM database_writer WHERE id = 1

-- name: database_writer_publish
UPDATE database_writer SET host = %(host)s, changed_by = %(by)s, changed_at = NOW(6) WHERE id = 1 AND NOT (host <=> %(host)s)
