-- Operators' reads (orbit-admin) and the claim-turn counters nodes record for them.
-- None of these statements decides ownership; the reads lock nothing.

-- ---------------------------------------------------------------------------------
-- Claim turns (written by every node, read by orbit-admin top)
-- ---------------------------------------------------------------------------------

-- The node's cumulative turns of the named applications. %(values)s: application id ->
-- turns (JSON object). Reading the ids from applications keeps out anything unknown.
-- name: ops_turns_upsert
INSERT INTO claim_turns (node_id, application_id, turns)
SELECT %(node_id)s, a.application_id,
       CAST(JSON_UNQUOTE(JSON_EXTRACT(%(values)s, CONCAT('$."', a.application_id, '"'))) AS UNSIGNED)
  FROM applications a
 WHERE a.application_id IN %(application_ids)s
ON DUPLICATE KEY UPDATE turns = VALUES(turns)

-- The turns the node granted the named applications since its last write, added to the
-- current database-clock minute; %(values)s as in ops_turns_upsert (application id ->
-- turns), one statement for all of them, so a failure adds none.
-- name: ops_turn_minutes_add
INSERT INTO claim_turn_minutes (application_id, minute, node_id, turns)
SELECT a.application_id, NOW() - INTERVAL SECOND(NOW()) SECOND, %(node_id)s,
       CAST(JSON_UNQUOTE(JSON_EXTRACT(%(values)s, CONCAT('$."', a.application_id, '"'))) AS UNSIGNED)
  FROM applications a
 WHERE a.application_id IN %(application_ids)s
ON DUPLICATE KEY UPDATE turns = claim_turn_minutes.turns + VALUES(turns)

-- Turns per application and minute over the last %(minutes)s minutes (every node summed),
-- oldest first, with the database clock's current minute.
-- name: ops_turn_minutes_recent
SELECT m.application_id, a.name AS application, a.fairness_weight, m.minute, SUM(m.turns) AS turns,
       (NOW() - INTERVAL SECOND(NOW()) SECOND) AS current_minute
  FROM claim_turn_minutes m
  LEFT JOIN applications a ON a.application_id = m.application_id
 WHERE m.minute >= (NOW() - INTERVAL SECOND(NOW()) SECOND) - INTERVAL %(minutes)s MINUTE
 GROUP BY m.application_id, a.name, a.fairness_weight, m.minute
 ORDER BY m.minute, m.application_id

-- name: ops_turn_minutes_prune
DELETE FROM claim_turn_minutes WHERE minute < NOW() - INTERVAL %(keep_minutes)s MINUTE

-- name: ops_turns_forget_node
DELETE FROM claim_turns WHERE node_id = %(node_id)s

-- Counters of nodes that stopped, or died without saying so long ago.
-- name: ops_turns_prune
DELETE ct FROM claim_turns ct
  LEFT JOIN nodes n ON n.node_id = ct.node_id
 WHERE n.node_id IS NULL
    OR n.stopped_at IS NOT NULL
    OR n.heartbeat_at < NOW(6) - INTERVAL %(stale_s)s SECOND

-- Counters of live nodes (not stopped, heartbeat recent).
-- name: ops_turns_live
SELECT ct.node_id, ct.application_id, a.name AS application, a.fairness_weight, ct.turns
  FROM claim_turns ct
  JOIN nodes n ON n.node_id = ct.node_id
  LEFT JOIN applications a ON a.application_id = ct.application_id
 WHERE n.stopped_at IS NULL
   AND n.heartbeat_at > NOW(6) - INTERVAL %(stale_s)s SECOND
 ORDER BY ct.node_id, ct.application_id

-- The cumulative turns of the named applications on every other live node: each node reads
-- them once a scan cycle, and what they gained since its previous read counts in its own
-- rotation as turns taken elsewhere (the share across nodes, docs/scheduling.md).
-- %(applications)s: [{"a": application id}, ...]. The ids come through JSON_TABLE so that
-- each (live node, application) is one primary-key lookup (an IN list on the key's second
-- part would read every row of each node); nothing is locked.
-- name: ops_turns_elsewhere
SELECT ct.node_id, ct.application_id, ct.turns
  FROM nodes n
  STRAIGHT_JOIN JSON_TABLE(%(applications)s, '$[*]' COLUMNS (
         application_id CHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$.a')) v
  STRAIGHT_JOIN claim_turns ct ON ct.node_id = n.node_id AND ct.application_id = v.application_id
 WHERE n.node_id <> %(node_id)s
   AND n.stopped_at IS NULL
   AND n.heartbeat_at > NOW(6) - INTERVAL %(stale_s)s SECOND

-- name: ops_nodes_live
SELECT n.node_id, n.hostname, n.http_addr, n.version, n.started_at, n.heartbeat_at,
       TIMESTAMPDIFF(MICROSECOND, n.heartbeat_at, NOW(6)) / 1000000 AS heartbeat_age_s,
       (SELECT COUNT(*) FROM worker_connections wc WHERE wc.node_id = n.node_id) AS connections
  FROM nodes n
 WHERE n.stopped_at IS NULL
   AND n.heartbeat_at > NOW(6) - INTERVAL %(stale_s)s SECOND
 ORDER BY n.started_at, n.node_id

-- ---------------------------------------------------------------------------------
-- Applications, namespaces, credentials
-- ---------------------------------------------------------------------------------

-- Live tasks per application through ix_tasks_app_state (application_id, state); its
-- Worker connections registered by live nodes (the registry is small: one row per connection).
-- name: ops_applications
SELECT a.application_id, a.name, a.suspended, a.max_concurrent_executions, a.max_starts_per_second,
       a.fairness_weight, a.retain_succeeded_s, a.retain_failed_s, a.submits_per_second, a.submit_burst,
       a.max_worker_connections,
       (SELECT COUNT(*) FROM tasks t WHERE t.application_id = a.application_id AND t.state = 'queued') AS queued,
       (SELECT COUNT(*) FROM tasks t WHERE t.application_id = a.application_id AND t.state = 'reserved') AS reserved,
       (SELECT COUNT(*) FROM tasks t WHERE t.application_id = a.application_id AND t.state = 'running') AS running,
       (SELECT COUNT(*) FROM worker_connections wc
          JOIN namespaces wn ON wn.namespace_id = wc.namespace_id
          JOIN nodes wd ON wd.node_id = wc.node_id
         WHERE wn.application_id = a.application_id
           AND wd.stopped_at IS NULL
           AND wd.heartbeat_at > NOW(6) - INTERVAL %(stale_s)s SECOND) AS worker_connections
  FROM applications a
 WHERE (%(name)s IS NULL OR a.name = %(name)s)
 ORDER BY a.name

-- Change only the quota fields the caller names (flags), in one statement, so two
-- operators changing different fields do not undo each other.
-- name: ops_app_patch_quota
UPDATE applications
   SET max_concurrent_executions = IF(%(set_max_concurrent_executions)s, %(max_concurrent_executions)s,
                                      max_concurrent_executions),
       max_starts_per_second = IF(%(set_max_starts_per_second)s, %(max_starts_per_second)s, max_starts_per_second)
 WHERE application_id = %(application_id)s

-- The submit rate limit: NULL takes the burst with it (an unlimited application has no
-- bucket); a rate without a burst named keeps the burst it had.
-- name: ops_app_set_submit_rate
UPDATE applications
   SET submits_per_second = %(submits_per_second)s,
       submit_burst = IF(%(submits_per_second)s IS NULL, NULL,
                         IF(%(set_submit_burst)s, %(submit_burst)s, submit_burst))
 WHERE application_id = %(application_id)s

-- name: ops_app_set_weight
UPDATE applications SET fairness_weight = %(fairness_weight)s WHERE application_id = %(application_id)s

-- name: ops_app_set_max_worker_connections
UPDATE applications SET max_worker_connections = %(max_worker_connections)s WHERE application_id = %(application_id)s

-- name: ops_namespace
SELECT n.namespace_id, n.application_id, n.name, n.environment, a.name AS application
  FROM namespaces n
  JOIN applications a ON a.application_id = n.application_id
 WHERE a.name = %(application)s AND n.name = %(namespace)s

-- name: ops_credentials
SELECT c.credential_id, c.name, c.scopes, c.created_at, c.revoked_at,
       n.name AS namespace, n.namespace_id, a.name AS application
  FROM credentials c
  JOIN namespaces n ON n.namespace_id = c.namespace_id
  JOIN applications a ON a.application_id = n.application_id
 WHERE a.name = %(application)s
   AND (%(namespace)s IS NULL OR n.name = %(namespace)s)
 ORDER BY n.name, c.created_at, c.credential_id

-- ---------------------------------------------------------------------------------
-- Queues and their backlog
-- ---------------------------------------------------------------------------------

-- name: ops_queues
SELECT q.queue_id, q.name, q.paused, q.max_concurrency, q.max_starts_per_second, q.max_running_per_key,
       n.namespace_id, n.name AS namespace, n.environment, a.application_id, a.name AS application
  FROM queues q
  JOIN namespaces n ON n.namespace_id = q.namespace_id
  JOIN applications a ON a.application_id = q.application_id
 WHERE (%(application)s IS NULL OR a.name = %(application)s)
   AND (%(namespace)s IS NULL OR n.name = %(namespace)s)
 ORDER BY a.name, n.name, q.name

-- A queue of any namespace by its id (orbit-admin queue pause|resume QUEUE_ID).
-- name: ops_queue_of_id
SELECT q.queue_id, q.namespace_id, q.name, n.name AS namespace, a.name AS application
  FROM queues q
  JOIN namespaces n ON n.namespace_id = q.namespace_id
  JOIN applications a ON a.application_id = q.application_id
 WHERE q.queue_id = %(queue_id)s

-- The queues of one namespace (the console: a credential sees its own namespace only),
-- all of them or those of %(queue_ids)s.
-- name: ops_queues_of_namespace
SELECT q.queue_id, q.name, q.paused, q.max_concurrency, q.max_starts_per_second, q.max_running_per_key,
       n.namespace_id, n.name AS namespace, n.environment, a.application_id, a.name AS application
  FROM queues q
  JOIN namespaces n ON n.namespace_id = q.namespace_id
  JOIN applications a ON a.application_id = q.application_id
 WHERE q.namespace_id = %(namespace_id)s
   AND (%(all_queues)s OR q.queue_id IN %(queue_ids)s)
 ORDER BY q.name

-- Live tasks per queue and state; queued ones split by due now or later. A range of the
-- dispatch index per (queue, state), which also holds available_at: no row is read.
-- The age of the oldest due task (queued, available_at passed) comes from the same range.
-- name: ops_queue_states
SELECT queue_id, state, COUNT(*) AS n, CAST(SUM(available_at <= NOW(6)) AS SIGNED) AS due,
       TIMESTAMPDIFF(MICROSECOND, MIN(IF(available_at <= NOW(6), available_at, NULL)), NOW(6)) / 1000000
         AS oldest_due_age_s
  FROM tasks FORCE INDEX (ix_tasks_dispatch)
 WHERE queue_id IN %(queue_ids)s
   AND state IN ('waiting', 'queued', 'reserved', 'running')
 GROUP BY queue_id, state

-- Queued tasks per queue and priority level. The level is read back from the dispatch
-- index (dispatch_at = available_at - priority * step, both in the index; the step in
-- microseconds is the parameter) so the count never touches the rows: a big backlog
-- costs an index range scan, not row lookups.
-- name: ops_queue_priorities
SELECT queue_id,
       CAST(ROUND(TIMESTAMPDIFF(MICROSECOND, dispatch_at, available_at) / %(priority_step_us)s) AS SIGNED) AS level,
       COUNT(*) AS n
  FROM tasks FORCE INDEX (ix_tasks_dispatch)
 WHERE queue_id IN %(queue_ids)s
   AND state = 'queued'
 GROUP BY queue_id, level

-- ---------------------------------------------------------------------------------
-- One task
-- ---------------------------------------------------------------------------------

-- The tasks of %(task_ids)s (a tuple), of any namespace or of %(namespace_id)s only.
-- name: ops_task
SELECT t.task_id, t.application_id, t.namespace_id, t.queue_id, t.handler, t.handler_version, t.payload_version,
       t.payload, t.state, t.priority, t.available_at, t.dispatch_at, t.deadline, t.attempts, t.max_attempts,
       t.backoff_initial_ms, t.backoff_max_ms, t.backoff_multiplier, t.resource_key, t.cancel_requested,
       t.owner_node_id, t.connection_id, t.lease_expires_at, t.reserved_at, t.started_at, t.finished_at,
       t.result, t.error, t.plan_id, t.plan_version, t.retried_from, t.created_at, t.updated_at,
       q.name AS queue, n.name AS namespace, n.environment, a.name AS application
  FROM tasks t
  LEFT JOIN queues q ON q.queue_id = t.queue_id
  LEFT JOIN namespaces n ON n.namespace_id = t.namespace_id
  LEFT JOIN applications a ON a.application_id = t.application_id
 WHERE t.task_id IN %(task_ids)s
   AND (%(namespace_id)s IS NULL OR t.namespace_id = %(namespace_id)s)

-- Attempt histories of the tasks of %(task_ids)s (fencing tokens are left out: they are
-- the attempt's credential); a range of uq_attempts_token per task.
-- name: ops_task_attempts
SELECT task_id, attempt, outcome, owner_node_id, connection_id, reserved_at, started_at, finished_at, error
  FROM task_attempts
 WHERE task_id IN %(task_ids)s
 ORDER BY task_id, attempt_id

-- ---------------------------------------------------------------------------------
-- Worker connections of one namespace (the console)
-- ---------------------------------------------------------------------------------

-- Connections registered by live nodes, with the tasks each holds (reserved or running
-- under its connection id) and the age of its registry heartbeat (refreshed by its node).
-- name: ops_workers_of_namespace
SELECT wc.connection_id, wc.node_id, n.hostname, n.http_addr, wc.queues, wc.capabilities,
       wc.resource_key_support, wc.capacity, wc.client_name, wc.client_version, wc.connected_at, wc.heartbeat_at,
       TIMESTAMPDIFF(MICROSECOND, wc.heartbeat_at, NOW(6)) / 1000000 AS heartbeat_age_s,
       COALESCE(h.held, 0) AS held
  FROM worker_connections wc
  JOIN nodes n ON n.node_id = wc.node_id
  -- Live tasks are few (at most the Workers' capacity): a range of the lease index.
  LEFT JOIN (SELECT t.connection_id, COUNT(*) AS held
               FROM tasks t FORCE INDEX (ix_tasks_lease)
              WHERE t.state IN ('reserved', 'running') AND t.namespace_id = %(namespace_id)s
              GROUP BY t.connection_id) h ON h.connection_id = wc.connection_id
 WHERE wc.namespace_id = %(namespace_id)s
   AND n.stopped_at IS NULL
   AND n.heartbeat_at > NOW(6) - INTERVAL %(stale_s)s SECOND
 ORDER BY n.started_at, wc.node_id, wc.connected_at, wc.connection_id
