-- Tasks as the task interface sees them: acceptance, reads, listing, cancellation.
-- Every time written here comes from the database clock (NOW(6) in a UTC session).

-- The queue a plan names, with the application that owns it (tasks copy it).
-- name: task_submit_queue
SELECT queue_id, application_id
  FROM queues
 WHERE namespace_id = %(namespace_id)s AND queue_id = %(queue_id)s

-- The queues a batch of submissions names, with the application that owns each (tasks
-- copy it), and the database clock every task of the acceptance transaction is stamped with.
-- name: task_submit_queues
SELECT queue_id, application_id, NOW(6) AS db_now
  FROM queues
 WHERE namespace_id = %(namespace_id)s AND queue_id IN %(queue_ids)s

-- The acceptance records go in first (one multi-row INSERT, keys in sorted order): a
-- concurrent submission with one of the keys waits on it and then fails with a duplicate
-- key, so only one task is ever created per key.
-- name: idempotency_insert
INSERT INTO idempotency_records (namespace_id, kind, idempotency_key, request_digest, task_id)
VALUES (%(namespace_id)s, %(kind)s, %(idempotency_key)s, %(request_digest)s, %(task_id)s)

-- name: idempotency_get_many
SELECT idempotency_key, request_digest, task_id
  FROM idempotency_records
 WHERE namespace_id = %(namespace_id)s AND kind = %(kind)s AND idempotency_key IN %(keys)s

-- Tasks, one multi-row INSERT (Tx.execute_rows): the VALUES list holds placeholders only.
-- available_at is the client's UTC timestamp (a plan's fire time), or the database clock
-- read at the start of the acceptance transaction plus the delay; created_at and
-- updated_at are that same clock. plan_id/plan_version are NULL except for tasks a plan
-- created.
-- name: task_insert
INSERT INTO tasks (
  task_id, application_id, namespace_id, queue_id,
  handler, handler_version, payload_version, payload, priority,
  available_at, deadline, max_attempts,
  backoff_initial_ms, backoff_max_ms, backoff_multiplier, resource_key, plan_id, plan_version,
  created_at, updated_at
) VALUES (
  %(task_id)s, %(application_id)s, %(namespace_id)s, %(queue_id)s,
  %(handler)s, %(handler_version)s, %(payload_version)s, %(payload)s, %(priority)s,
  %(available_at)s, %(deadline)s, %(max_attempts)s,
  %(backoff_initial_ms)s, %(backoff_max_ms)s, %(backoff_multiplier)s, %(resource_key)s, %(plan_id)s, %(plan_version)s,
  %(created_at)s, %(created_at)s
)

-- The dispatch core needs an occupancy row for every resource key a task names.
-- A plain read first, so a hot key's row is not locked by every submission.
-- name: resource_keys_present
SELECT resource_key
  FROM resource_keys
 WHERE namespace_id = %(namespace_id)s AND resource_key IN %(resource_keys)s

-- name: resource_key_ensure
INSERT IGNORE INTO resource_keys (namespace_id, resource_key)
VALUES (%(namespace_id)s, %(resource_key)s)

-- name: task_get
SELECT task_id, application_id, namespace_id, queue_id, handler, handler_version, payload_version,
       payload, state, priority, available_at, deadline, attempts, max_attempts,
       backoff_initial_ms, backoff_max_ms, backoff_multiplier, resource_key, cancel_requested,
       reserved_at, started_at, finished_at, result, error, plan_id, plan_version, created_at, updated_at
  FROM tasks
 WHERE namespace_id = %(namespace_id)s AND task_id = %(task_id)s

-- name: task_get_many
SELECT task_id, application_id, namespace_id, queue_id, handler, handler_version, payload_version,
       payload, state, priority, available_at, deadline, attempts, max_attempts,
       backoff_initial_ms, backoff_max_ms, backoff_multiplier, resource_key, cancel_requested,
       reserved_at, started_at, finished_at, result, error, plan_id, plan_version, created_at, updated_at
  FROM tasks
 WHERE namespace_id = %(namespace_id)s AND task_id IN %(task_ids)s

-- Newest first. Optional filters are NULL when absent (the server folds the constant
-- test away); queue-scoped credentials pass the queue ids they may read. The
-- (namespace_id, task_id) index bounds the scan to the namespace and gives the order,
-- so a page never sorts and never reads another tenant's rows.
-- name: task_list
SELECT task_id, queue_id, handler, handler_version, payload_version, state, priority,
       available_at, deadline, attempts, max_attempts, resource_key, cancel_requested,
       created_at, finished_at
  FROM tasks FORCE INDEX (ix_tasks_ns_task)
 WHERE namespace_id = %(namespace_id)s
   AND task_id < %(before)s
   AND (%(queue_id)s IS NULL OR queue_id = %(queue_id)s)
   AND (%(state)s IS NULL OR state = %(state)s)
   AND (%(all_queues)s OR queue_id IN %(queue_ids)s)
 ORDER BY task_id DESC
 LIMIT %(limit)s

-- Cancellation locks the row first; a claim that holds it finishes, and we see its outcome.
-- name: task_lock_state
SELECT state
  FROM tasks
 WHERE namespace_id = %(namespace_id)s AND task_id = %(task_id)s
 FOR UPDATE

-- name: task_cancel_queued
UPDATE tasks
   SET state = 'cancelled', cancel_requested = 1, finished_at = NOW(6)
 WHERE namespace_id = %(namespace_id)s AND task_id = %(task_id)s AND state = 'queued'

-- A reserved or running task keeps its state; the dispatch side settles it.
-- name: task_request_cancel
UPDATE tasks
   SET cancel_requested = 1
 WHERE namespace_id = %(namespace_id)s AND task_id = %(task_id)s AND state IN ('reserved', 'running')
