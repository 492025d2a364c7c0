-- Reads only the web console makes (orbit_node/store/console.py). None locks anything.

-- One task as its page shows it: every field but the stored values, of which only the
-- beginning (%(head_chars)s characters; the error, a TEXT of 64 KiB at most, up to
-- %(error_chars)s) and the whole size in bytes are read, so a task with a 1 MB payload
-- costs a few KiB per refresh. The payload's beginning only when asked (it never
-- changes: the page shows it once, outside the live panel).
-- name: console_task
SELECT t.task_id, t.application_id, t.namespace_id, t.queue_id, t.handler, t.handler_version, t.payload_version,
       t.state, t.priority, t.available_at, t.dispatch_at, t.deadline, t.attempts, t.max_attempts,
       t.resource_key, t.cancel_requested, t.reserved_at, t.started_at, t.finished_at, t.plan_id, t.plan_version,
       t.created_at, t.updated_at, q.name AS queue, t.retried_from,
       (SELECT r.task_id FROM tasks r WHERE r.retried_from = t.task_id) AS retried_by,
       IF(%(with_payload)s, LEFT(t.payload, %(head_chars)s), NULL) AS payload_head,
       IF(%(with_payload)s, LENGTH(t.payload), NULL) AS payload_bytes,
       LEFT(t.result, %(head_chars)s) AS result_head, LENGTH(t.result) AS result_bytes,
       LEFT(t.error, %(error_chars)s) AS error_head, LENGTH(t.error) AS error_bytes
  FROM tasks t
  LEFT JOIN queues q ON q.queue_id = t.queue_id
 WHERE t.task_id = %(task_id)s
   AND t.namespace_id = %(namespace_id)s

-- Its attempts (no fencing token), each error's beginning and size.
-- name: console_task_attempts
SELECT attempt_id, attempt, owner_node_id, connection_id, reserved_at, started_at, finished_at, outcome,
       LEFT(error, %(error_chars)s) AS error_head, LENGTH(error) AS error_bytes
  FROM task_attempts
 WHERE task_id = %(task_id)s
 ORDER BY attempt_id

-- One stored value of a task whole (payload, result or error), with the task's queue.
-- name: console_task_value
SELECT queue_id,
       CASE %(name)s WHEN 'payload' THEN payload WHEN 'result' THEN result ELSE error END AS value
  FROM tasks
 WHERE task_id = %(task_id)s
   AND namespace_id = %(namespace_id)s

-- One attempt's error whole, with the task's queue.
-- name: console_attempt_error
SELECT t.queue_id, a.error AS value
  FROM task_attempts a
  JOIN tasks t ON t.task_id = a.task_id
 WHERE a.attempt_id = %(attempt_id)s
   AND a.task_id = %(task_id)s
   AND t.namespace_id = %(namespace_id)s

-- Due queued tasks of the queues per capability (handler, versions, resource-keyed or
-- not): what a Worker must announce to take them. The claim index holds every column
-- read (a task is due when dispatch_at + 30 s x priority, its available_at, has passed),
-- so a large backlog costs an index range scan per queue, not row reads.
-- name: console_due_capabilities
SELECT queue_id, handler, handler_version, payload_version, keyed, COUNT(*) AS due
  FROM tasks FORCE INDEX (ix_tasks_claim)
 WHERE queue_id IN %(queue_ids)s
   AND state = 'queued'
   AND dispatch_at <= NOW(6) - INTERVAL (priority * %(priority_step_s)s) SECOND
 GROUP BY queue_id, handler, handler_version, payload_version, keyed
 ORDER BY queue_id, due DESC
 LIMIT %(limit)s

-- Tasks whose id starts with a prefix (the console's search), with the listing's filters,
-- newest first by (created_at, task_id) after a cursor like every listing. Task ids
-- begin with their acceptance time in milliseconds, so the prefix bounds created_at:
-- %(created_after)s and %(created_before)s hold the prefix's time range widened by a
-- margin for the clocks (intersected with the filter's own range), and the scan is that
-- range of ix_tasks_ns_created, the namespace's rows only; the id range then picks them.
-- name: console_task_prefix
SELECT task_id, queue_id, handler, handler_version, payload_version, state, priority,
       available_at, deadline, attempts, max_attempts, resource_key, cancel_requested,
       created_at, finished_at, retried_from
  FROM tasks FORCE INDEX (ix_tasks_ns_created)
 WHERE namespace_id = %(namespace_id)s
   AND created_at >= %(created_after)s
   AND created_at < %(created_before)s
   AND task_id >= %(id_low)s
   AND task_id < %(id_high)s
   AND (%(after_at)s IS NULL OR created_at < %(after_at)s OR (created_at = %(after_at)s AND task_id < %(after_id)s))
   AND (%(queue_id)s IS NULL OR queue_id = %(queue_id)s)
   AND (%(all_queues)s OR queue_id IN %(queue_ids)s)
   AND (%(any_state)s OR state IN %(states)s)
   AND (%(handler)s IS NULL OR handler = %(handler)s)
   AND (%(any_priority)s OR priority IN %(priorities)s)
   AND (%(finished_after)s IS NULL OR finished_at >= %(finished_after)s)
   AND (%(finished_before)s IS NULL OR finished_at < %(finished_before)s)
 ORDER BY created_at DESC, task_id DESC
 LIMIT %(limit)s

-- Console sessions ended by sign-out (orbit_node/store/console_sessions.py).
-- name: console_session_ended
SELECT 1 AS ended FROM console_sessions_ended WHERE session_id = %(session_id)s

-- name: console_session_end
INSERT IGNORE INTO console_sessions_ended (session_id, expires_at)
VALUES (%(session_id)s, NOW(6) + INTERVAL %(expires_in_s)s SECOND)

-- Rows of sessions whose cookies have expired anyway, a bounded batch at a time.
-- name: console_sessions_forget
DELETE FROM console_sessions_ended WHERE expires_at < NOW(6) ORDER BY expires_at LIMIT %(limit)s
