-- name: worker_connection_insert
INSERT INTO worker_connections
  (connection_id, node_id, namespace_id, queues, capabilities, resource_key_support, capacity, client_name,
   client_version)
VALUES
  (%(connection_id)s, %(node_id)s, %(namespace_id)s, %(queues)s, %(capabilities)s, %(resource_key_support)s,
   %(capacity)s, %(client_name)s, %(client_version)s)

-- name: worker_connection_delete
DELETE FROM worker_connections WHERE connection_id = %(connection_id)s

-- name: worker_connections_of_node_delete
DELETE FROM worker_connections WHERE node_id = %(node_id)s

-- name: worker_connections_heartbeat
UPDATE worker_connections SET heartbeat_at = NOW(6) WHERE node_id = %(node_id)s
