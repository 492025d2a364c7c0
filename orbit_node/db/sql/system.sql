-- name: ping
SELECT 1 AS ok

-- name: db_now
SELECT NOW(6) AS now

-- name: node_register
INSERT INTO nodes (node_id, hostname, http_addr, version) VALUES (%(node_id)s, %(hostname)s, %(http_addr)s, %(version)s)

-- name: node_heartbeat
UPDATE nodes SET heartbeat_at = NOW(6) WHERE node_id = %(node_id)s

-- name: node_stopped
UPDATE nodes SET stopped_at = NOW(6), heartbeat_at = NOW(6) WHERE node_id = %(node_id)s
