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
-- created. state is queued, or (a task with parents, 000027) waiting, or cancelled with
-- its error and finished_at when a parent had failed already.
-- name: task_insert
INSERT INTO tasks (
  task_id, application_id, namespace_id, queue_id,
  handler, handler_version, payload_version, payload, priority, state,
  available_at, deadline, max_attempts,
  backoff_initial_ms, backoff_max_ms, backoff_multiplier, resource_key, plan_id, plan_version, retried_from,
  error, finished_at, created_at, updated_at
) VALUES (
  %(task_id)s, %(application_id)s, %(namespace_id)s, %(queue_id)s,
  %(handler)s, %(handler_version)s, %(payload_version)s, %(payload)s, %(priority)s, %(state)s,
  %(available_at)s, %(deadline)s, %(max_attempts)s,
  %(backoff_initial_ms)s, %(backoff_max_ms)s, %(backoff_multiplier)s, %(resource_key)s, %(plan_id)s, %(plan_version)s,
  %(retried_from)s, %(error)s, %(finished_at)s, %(created_at)s, %(created_at)s
)

-- A new task's parents (000027): locked shared, so that a parent's Finish waits for this
-- acceptance to commit (and then sees its edges) or this acceptance reads the state the
-- Finish committed; either way the child is counted exactly once.
-- name: dependency_parents_lock
SELECT task_id, application_id, state
  FROM tasks FORCE INDEX (PRIMARY)
 WHERE task_id IN %(task_ids)s
  LOCK IN SHARE MODE

-- name: dependency_edges_insert
INSERT INTO task_parents (child_task_id, parent_task_id) VALUES (%(child_task_id)s, %(parent_task_id)s)

-- name: dependency_waits_insert
INSERT INTO task_waits (task_id, parents_left) VALUES (%(task_id)s, %(parents_left)s)

-- The trace contexts of the tasks just written that carry one (000026), in the same
-- transaction.
-- name: task_trace_context_insert
INSERT INTO task_trace_contexts (task_id, trace_context) VALUES (%(task_id)s, %(trace_context)s)

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
       reserved_at, started_at, finished_at, result, error, plan_id, plan_version, retried_from,
       created_at, updated_at
  FROM tasks
 WHERE namespace_id = %(namespace_id)s AND task_id = %(task_id)s

-- The states of tasks requests of a node wait for (dispatch/waits.py): by primary key, one
-- statement for all of them, whatever their namespaces.
-- name: task_states
SELECT task_id, state
  FROM tasks FORCE INDEX (PRIMARY)
 WHERE task_id IN %(task_ids)s

-- name: task_get_many
SELECT task_id, application_id, namespace_id, queue_id, handler, handler_version, payload_version,
       payload, state, priority, available_at, deadline, attempts, max_attempts,
       backoff_initial_ms, backoff_max_ms, backoff_multiplier, resource_key, cancel_requested,
       reserved_at, started_at, finished_at, result, error, plan_id, plan_version, retried_from,
       created_at, updated_at
  FROM tasks
 WHERE namespace_id = %(namespace_id)s AND task_id IN %(task_ids)s

-- Task searches (store/search.py): summaries newest first by (created_at, task_id), after
-- the cursor (%(after_at)s, %(after_id)s) when one is given. Every filter is NULL (or a
-- flag) when absent, and the server folds the constant test away; queue-scoped
-- credentials pass the queue ids they may read. Three shapes, each an index range in the
-- page's order, so a page never sorts a namespace and never reads another tenant's rows:
-- no state filter (ix_tasks_ns_created), one branch per state (ix_tasks_app_state, joined
-- with UNION ALL and merged by task_search_order), named task ids (the primary key).
-- name: task_search
SELECT task_id, queue_id, handler, handler_version, payload_version, state, priority,
       available_at, deadline, attempts, max_attempts, resource_key, cancel_requested,
       created_at, finished_at, retried_from
  FROM tasks FORCE INDEX (ix_tasks_ns_created)
 WHERE namespace_id = %(namespace_id)s
   AND (%(after_at)s IS NULL OR created_at < %(after_at)s OR (created_at = %(after_at)s AND task_id < %(after_id)s))
   AND (%(queue_id)s IS NULL OR queue_id = %(queue_id)s)
   AND (%(all_queues)s OR queue_id IN %(queue_ids)s)
   AND (%(handler)s IS NULL OR handler = %(handler)s)
   AND (%(any_priority)s OR priority IN %(priorities)s)
   AND (%(created_after)s IS NULL OR created_at >= %(created_after)s)
   AND (%(created_before)s IS NULL OR created_at < %(created_before)s)
   AND (%(finished_after)s IS NULL OR finished_at >= %(finished_after)s)
   AND (%(finished_before)s IS NULL OR finished_at < %(finished_before)s)
 ORDER BY created_at DESC, task_id DESC
 LIMIT %(limit)s

-- name: task_search_branch
(SELECT task_id, queue_id, handler, handler_version, payload_version, state, priority,
        available_at, deadline, attempts, max_attempts, resource_key, cancel_requested,
        created_at, finished_at, retried_from
   FROM tasks FORCE INDEX (ix_tasks_app_state)
  WHERE application_id = %(application_id)s
    AND state = %(state_{i})s
    AND namespace_id = %(namespace_id)s
    AND (%(after_at)s IS NULL OR created_at < %(after_at)s OR (created_at = %(after_at)s AND task_id < %(after_id)s))
    AND (%(queue_id)s IS NULL OR queue_id = %(queue_id)s)
    AND (%(all_queues)s OR queue_id IN %(queue_ids)s)
    AND (%(handler)s IS NULL OR handler = %(handler)s)
    AND (%(any_priority)s OR priority IN %(priorities)s)
    AND (%(created_after)s IS NULL OR created_at >= %(created_after)s)
    AND (%(created_before)s IS NULL OR created_at < %(created_before)s)
    AND (%(finished_after)s IS NULL OR finished_at >= %(finished_after)s)
    AND (%(finished_before)s IS NULL OR finished_at < %(finished_before)s)
  ORDER BY created_at DESC, task_id DESC
  LIMIT %(limit)s)

-- name: task_search_order
ORDER BY created_at DESC, task_id DESC
LIMIT %(limit)s

-- name: task_search_ids
SELECT task_id, queue_id, handler, handler_version, payload_version, state, priority,
       available_at, deadline, attempts, max_attempts, resource_key, cancel_requested,
       created_at, finished_at, retried_from
  FROM tasks FORCE INDEX (PRIMARY)
 WHERE task_id IN %(task_ids)s
   AND namespace_id = %(namespace_id)s
   AND (%(any_state)s OR state IN %(states)s)
   AND (%(after_at)s IS NULL OR created_at < %(after_at)s OR (created_at = %(after_at)s AND task_id < %(after_id)s))
   AND (%(queue_id)s IS NULL OR queue_id = %(queue_id)s)
   AND (%(all_queues)s OR queue_id IN %(queue_ids)s)
   AND (%(handler)s IS NULL OR handler = %(handler)s)
   AND (%(any_priority)s OR priority IN %(priorities)s)
   AND (%(created_after)s IS NULL OR created_at >= %(created_after)s)
   AND (%(created_before)s IS NULL OR created_at < %(created_before)s)
   AND (%(finished_after)s IS NULL OR finished_at >= %(finished_after)s)
   AND (%(finished_before)s IS NULL OR finished_at < %(finished_before)s)
 ORDER BY created_at DESC, task_id DESC
 LIMIT %(limit)s

-- The application of a namespace (a fixed fact: the per-state search ranges start with it).
-- name: task_namespace_application
SELECT application_id FROM namespaces WHERE namespace_id = %(namespace_id)s

-- Cancellation (one task or a bulk cancel) locks the rows first, in primary-key order; a
-- claim or a Worker's transition that holds one finishes, and we see its outcome.
-- name: task_lock_states
SELECT task_id, queue_id, state, cancel_requested
  FROM tasks
 WHERE namespace_id = %(namespace_id)s AND task_id IN %(task_ids)s
 ORDER BY task_id
 FOR UPDATE

-- name: task_cancel_queued
UPDATE tasks
   SET state = 'cancelled', cancel_requested = 1, finished_at = NOW(6)
 WHERE namespace_id = %(namespace_id)s AND task_id IN %(task_ids)s AND state IN ('queued', 'waiting')

-- A reserved or running task keeps its state; the dispatch side settles it.
-- name: task_request_cancel
UPDATE tasks
   SET cancel_requested = 1
 WHERE namespace_id = %(namespace_id)s AND task_id IN %(task_ids)s AND state IN ('reserved', 'running')

-- Retry (store/actions.py): the tasks to retry, what a retry copies of them, and the
-- database clock the retries are stamped with. Not locked: a failed, cancelled or expired
-- task never changes again, and a task in another state is refused as it is read.
-- name: task_retry_sources
SELECT task_id, application_id, queue_id, handler, handler_version, payload_version, payload, state,
       priority, deadline, max_attempts, backoff_initial_ms, backoff_max_ms, backoff_multiplier,
       resource_key, created_at, NOW(6) AS db_now,
       (SELECT c.trace_context FROM task_trace_contexts c WHERE c.task_id = tasks.task_id) AS trace_context
  FROM tasks
 WHERE namespace_id = %(namespace_id)s AND task_id IN %(task_ids)s

-- The retries that exist already (ux_tasks_retried_from: at most one per task).
-- name: task_retries_of
SELECT retried_from, task_id
  FROM tasks FORCE INDEX (ux_tasks_retried_from)
 WHERE retried_from IN %(task_ids)s AND namespace_id = %(namespace_id)s

-- What a listing shows of its finished tasks (orbit-admin task list, the console): its
-- error's code and the beginning of its message (the stored error is always a JSON
-- object), and the task that retried each (its retry's id), none of the payload.
-- name: task_finish_notes
SELECT t.task_id, JSON_UNQUOTE(JSON_EXTRACT(t.error, '$.code')) AS error_code,
       LEFT(JSON_UNQUOTE(JSON_EXTRACT(t.error, '$.message')), 300) AS error_message,
       (SELECT r.task_id FROM tasks r WHERE r.retried_from = t.task_id LIMIT 1) AS retried_by
  FROM tasks t
 WHERE t.namespace_id = %(namespace_id)s AND t.task_id IN %(task_ids)s
