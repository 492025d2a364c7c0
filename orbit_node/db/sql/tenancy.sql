-- name: app_insert_ignore
INSERT IGNORE INTO applications (application_id, name) VALUES (%(application_id)s, %(name)s)

-- name: app_by_name
SELECT * FROM applications WHERE name = %(name)s

-- name: app_by_id
SELECT * FROM applications WHERE application_id = %(application_id)s

-- name: app_set_quota
UPDATE applications
   SET max_concurrent_executions = %(max_concurrent_executions)s,
       max_starts_per_second = %(max_starts_per_second)s
 WHERE application_id = %(application_id)s

-- name: app_set_suspended
UPDATE applications SET suspended = %(suspended)s WHERE application_id = %(application_id)s

-- The applications whose fairness weight is not the default 1 (a range of
-- ix_applications_weight): what a node tells its claim scheduler, about once a second.
-- name: app_weights
SELECT application_id, fairness_weight FROM applications WHERE fairness_weight > 1

-- The applications with a submit rate limit, each with the number of live nodes (a
-- heartbeat younger than stale_s; operations' NODE_STALE_S) its limit is shared among: what
-- a node's submit buckets follow, about once a second (submit_rate.py). No rows: no limits.
-- name: app_submit_limits
SELECT a.application_id, a.submits_per_second, a.submit_burst,
       (SELECT COUNT(*) FROM nodes n
         WHERE n.stopped_at IS NULL AND n.heartbeat_at > NOW(6) - INTERVAL %(stale_s)s SECOND) AS live_nodes
  FROM applications a
 WHERE a.submits_per_second IS NOT NULL

-- name: ns_insert_ignore
INSERT IGNORE INTO namespaces (namespace_id, application_id, name, environment)
VALUES (%(namespace_id)s, %(application_id)s, %(name)s, %(environment)s)

-- name: ns_by_name
SELECT * FROM namespaces WHERE application_id = %(application_id)s AND name = %(name)s

-- name: ns_by_id
SELECT n.*, a.name AS application_name
  FROM namespaces n JOIN applications a ON a.application_id = n.application_id
 WHERE n.namespace_id = %(namespace_id)s

-- name: queue_insert
INSERT INTO queues (queue_id, namespace_id, application_id, name, max_concurrency, max_starts_per_second,
                    max_running_per_key)
VALUES (%(queue_id)s, %(namespace_id)s, %(application_id)s, %(name)s, %(max_concurrency)s, %(max_starts_per_second)s,
        %(max_running_per_key)s)

-- name: queue_by_name
SELECT * FROM queues WHERE namespace_id = %(namespace_id)s AND name = %(name)s

-- name: queue_by_id
SELECT * FROM queues WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s

-- name: queues_by_ids
SELECT * FROM queues WHERE namespace_id = %(namespace_id)s AND queue_id IN %(queue_ids)s

-- name: queue_list
SELECT * FROM queues
 WHERE namespace_id = %(namespace_id)s AND queue_id > %(after)s
 ORDER BY queue_id
 LIMIT %(limit)s

-- A listing limited to the queues a queue-scoped credential may see.
-- name: queue_list_in
SELECT * FROM queues
 WHERE namespace_id = %(namespace_id)s AND queue_id > %(after)s AND queue_id IN %(queue_ids)s
 ORDER BY queue_id
 LIMIT %(limit)s

-- name: queue_set_paused
UPDATE queues SET paused = %(paused)s WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s

-- name: queue_set_controls
UPDATE queues
   SET max_concurrency = %(max_concurrency)s, max_starts_per_second = %(max_starts_per_second)s
 WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s

-- name: credential_insert
INSERT INTO credentials (credential_id, namespace_id, name, secret_sha256, scopes)
VALUES (%(credential_id)s, %(namespace_id)s, %(name)s, %(secret_sha256)s, %(scopes)s)

-- name: credential_by_id
SELECT c.*, n.application_id, n.name AS namespace_name, n.environment, a.name AS application_name,
       a.suspended AS application_suspended, a.max_worker_connections
  FROM credentials c
  JOIN namespaces n ON n.namespace_id = c.namespace_id
  JOIN applications a ON a.application_id = n.application_id
 WHERE c.credential_id = %(credential_id)s

-- name: credential_revoke
UPDATE credentials SET revoked_at = NOW(6) WHERE credential_id = %(credential_id)s AND revoked_at IS NULL

-- name: credential_list
SELECT credential_id, namespace_id, name, scopes, created_at, revoked_at
  FROM credentials WHERE namespace_id = %(namespace_id)s ORDER BY created_at, credential_id

-- Change only the controls the caller names (flags), in one statement, so two
-- concurrent changes of different controls do not undo each other.
-- name: queue_patch_controls
UPDATE queues
   SET max_concurrency = IF(%(set_max_concurrency)s, %(max_concurrency)s, max_concurrency),
       max_starts_per_second = IF(%(set_max_starts_per_second)s, %(max_starts_per_second)s, max_starts_per_second),
       max_running_per_key = IF(%(set_max_running_per_key)s, %(max_running_per_key)s, max_running_per_key)
 WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s
