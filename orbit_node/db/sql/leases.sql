-- The lease store: claims, transitions, recovery and explanations (orbit_node.store.leases).
--
-- Every time that decides ownership is the database clock NOW(6) (UTC sessions).
-- Lock order, always: applications -> queues -> tasks -> resource_keys ->
-- resource_key_holders. Claims and the sweeper lock task and resource-key rows only with
-- SKIP LOCKED, so they never wait on them; transitions (start, renew, finish, release)
-- lock their own task rows (plain FOR UPDATE, primary key order) and then resource keys.
--
-- Per-task values of a batch go in one statement whatever the batch's size: a
-- claim's tokens as a JSON array (%(values)s), the transitions' values as CASE
-- expressions over the task id (Tx.execute_per_row).

-- ---------------------------------------------------------------------------------
-- Claim
-- ---------------------------------------------------------------------------------

-- Gates of the requested queues and their application, without locking anything.
-- name: claim_gates
SELECT q.queue_id, q.paused, q.max_concurrency, q.max_starts_per_second, q.max_running_per_key,
       a.suspended AS app_suspended,
       a.max_concurrent_executions AS app_max_concurrent,
       a.max_starts_per_second AS app_max_starts
  FROM queues q
  JOIN applications a ON a.application_id = q.application_id
 WHERE q.namespace_id = %(namespace_id)s
   AND q.application_id = %(application_id)s
   AND q.queue_id IN %(queue_ids)s

-- Quota: the application row is the mutex of its quota across all nodes. UNIX_TIMESTAMP()
-- is the database-clock second of this statement (start-rate window).
-- name: claim_lock_application
SELECT suspended, max_concurrent_executions, max_starts_per_second,
       start_window_s, start_window_count, UNIX_TIMESTAMP() AS now_s
  FROM applications
 WHERE application_id = %(application_id)s
   FOR UPDATE

-- name: claim_count_application_live
SELECT COUNT(*) AS live
  FROM tasks FORCE INDEX (ix_tasks_app_state)
 WHERE application_id = %(application_id)s
   AND state IN ('reserved', 'running')

-- Queue controls: rows locked in primary-key order so two claims never wait on each other
-- in opposite orders.
-- name: claim_lock_queues
SELECT queue_id, paused, max_concurrency, max_starts_per_second,
       start_window_s, start_window_count, UNIX_TIMESTAMP() AS now_s
  FROM queues
 WHERE queue_id IN %(queue_ids)s
 ORDER BY queue_id
   FOR UPDATE

-- name: claim_count_queue_live
SELECT COUNT(*) AS live
  FROM tasks FORCE INDEX (ix_tasks_dispatch)
 WHERE queue_id = %(queue_id)s
   AND state IN ('reserved', 'running')

-- Claim, step 1: a non-locking ordered read of candidates. One branch per
-- (capability, keyed, priority level) of the claiming connection, each an ordered range
-- of ix_tasks_claim in which every row is due (available_at <= NOW(6) is, at a fixed
-- priority, dispatch_at <= NOW(6) - 30 s x priority) and runnable by the connection; each
-- reads at most %(limit)s rows. store/claim.py joins the branches with UNION ALL
-- ({i} numbers each branch's parameters) and claim_candidates_order merges them in
-- dispatch order. No row is locked here.
-- name: claim_candidates_branch
(SELECT task_id, resource_key, dispatch_at, available_at
   FROM tasks FORCE INDEX (ix_tasks_claim)
  WHERE queue_id = %(queue_id)s
    AND state = 'queued'
    AND handler = %(handler_{i})s
    AND handler_version = %(handler_version_{i})s
    AND payload_version = %(payload_version_{i})s
    AND keyed = %(keyed_{i})s
    AND priority = %(priority_{i})s
    AND dispatch_at <= NOW(6) - INTERVAL %(window_s_{i})s SECOND
  ORDER BY dispatch_at, task_id
  LIMIT %(limit)s)

-- name: claim_candidates_order
ORDER BY dispatch_at, available_at, task_id
LIMIT %(limit)s

-- Occupancy of resource keys as committed (non-locking): the first holder and its state.
-- A holder counts while its task is reserved or running (a repair: every transition
-- releases its key in its own transaction). For keys of a queue whose
-- max_running_per_key is 1, a claim picks its candidates by this alone (further holders,
-- 000028, exist only where another queue of the key admits more or the limit was
-- lowered; the count under the key's lock decides).
-- name: claim_key_state
SELECT rk.resource_key, rk.holder_task_id, h.state AS holder_state
  FROM resource_keys rk
  LEFT JOIN tasks h ON h.task_id = rk.holder_task_id
 WHERE rk.namespace_id = %(namespace_id)s
   AND rk.resource_key IN %(keys)s

-- The same with the further holders still reserved or running (resource_key_holders;
-- a row of the first holder as well is counted once): what a claim reads of a key of a
-- queue that admits more than one holder, what it counts of the keys it locked
-- (claim_lock_keys), and what explanations and listings say.
-- name: claim_key_occupancy
SELECT rk.resource_key, rk.holder_task_id, h.state AS holder_state,
       (SELECT COUNT(*)
          FROM resource_key_holders x
          STRAIGHT_JOIN tasks t FORCE INDEX (PRIMARY) ON t.task_id = x.task_id
         WHERE x.namespace_id = rk.namespace_id
           AND x.resource_key = rk.resource_key
           AND x.task_id <> COALESCE(rk.holder_task_id, '')
           AND t.state IN ('reserved', 'running')) AS further_live
  FROM resource_keys rk
  LEFT JOIN tasks h ON h.task_id = rk.holder_task_id
 WHERE rk.namespace_id = %(namespace_id)s
   AND rk.resource_key IN %(keys)s

-- Claim, step 2: lock exactly the chosen candidates by primary key; rows another claim
-- holds are skipped, rows that changed since step 1 are re-checked out. Only the columns
-- a reservation carries and those that say a candidate can never run: a queued task has
-- no token, lease or open attempt, and its namespace and application are the claimer's
-- (claim_gates); each column of a result costs the node its description and a value per
-- row. So `marks` is three flags in one column: 1 the deadline has passed, 2 the task has
-- a trace context (000026), 4 it has parents (000027): primary-key probes of their own
-- tables, which the locking clause leaves unlocked (it applies to the outer query's rows
-- only). Only a claim that takes a task so marked reads the contexts' text or the parents'
-- ids (claim_extras, with its COMMIT); the claims of other tasks read nothing more than a
-- number they read anyway.
-- name: claim_lock_tasks
SELECT task_id, queue_id, handler, handler_version, payload_version, payload, priority,
       attempts, max_attempts, deadline, resource_key, available_at, cancel_requested,
       (deadline IS NOT NULL AND deadline <= NOW(6))
         | 2 * EXISTS (SELECT 1 FROM task_trace_contexts c WHERE c.task_id = tasks.task_id)
         | 4 * EXISTS (SELECT 1 FROM task_parents p WHERE p.child_task_id = tasks.task_id) AS marks,
       NOW(6) AS now
  FROM tasks
 WHERE task_id IN %(task_ids)s
   AND state = 'queued'
   AND available_at <= NOW(6)
   FOR UPDATE SKIP LOCKED

-- The trace contexts and the parents of the tasks a claim reserves that have them (`marks`
-- & 2 and & 4 above), read in the claim's last packet, before its COMMIT. Neither changes
-- once its task is accepted, so the lock statement's probes and this read agree.
-- name: claim_extras
SELECT task_id, 'trace' AS kind, trace_context AS value
  FROM task_trace_contexts
 WHERE task_id IN %(traced)s
UNION ALL
SELECT child_task_id, 'parent', parent_task_id
  FROM task_parents
 WHERE child_task_id IN %(children)s

-- The key rows a claim takes from: each is its key's mutex, so that the count of its
-- live holders read after it (claim_key_occupancy, the next statement of the same
-- packet: a statement of its own, so that its snapshot is taken once every row is
-- locked) stays true until the claim commits. Only a claim holding the row adds a
-- holder; transitions only take holders away.
-- name: claim_lock_keys
SELECT resource_key, holder_task_id
  FROM resource_keys
 WHERE namespace_id = %(namespace_id)s
   AND resource_key IN %(keys)s
   FOR UPDATE SKIP LOCKED

-- A key named by a task whose submit did not create its occupancy row.
-- name: claim_insert_key
INSERT IGNORE INTO resource_keys (namespace_id, resource_key, holder_task_id)
VALUES (%(namespace_id)s, %(resource_key)s, %(task_id)s)

-- name: claim_hold_key
UPDATE resource_keys
   SET holder_task_id = %(task_id)s
 WHERE namespace_id = %(namespace_id)s
   AND resource_key = %(resource_key)s

-- A further holder of a key whose first holder is live (the claim holds the key's row).
-- IGNORE: a row the task kept from an earlier reservation (settled by a node that does
-- not know this table) is its row again.
-- name: claim_add_holder
INSERT IGNORE INTO resource_key_holders (namespace_id, resource_key, task_id)
VALUES (%(namespace_id)s, %(resource_key)s, %(task_id)s)

-- Claim, step 3: the reservation of the rows the claim locked, each with its own new
-- fencing token ({fencing_token}, a per-row value: Tx.defer_per_row). A single-table
-- UPDATE by primary key (no temporary table).
-- name: claim_reserve
UPDATE tasks FORCE INDEX (PRIMARY)
   SET state = 'reserved',
       owner_node_id = %(node_id)s,
       connection_id = %(connection_id)s,
       fencing_token = {fencing_token},
       reserved_at = %(now)s,
       lease_expires_at = %(lease_expires_at)s,
       started_at = NULL,
       finished_at = NULL
 WHERE task_id IN %(row_keys)s
   AND state = 'queued'

-- name: claim_insert_attempts
INSERT INTO task_attempts (task_id, attempt, fencing_token, owner_node_id, connection_id, reserved_at)
SELECT task_id, attempts + 1, fencing_token, owner_node_id, connection_id, reserved_at
  FROM tasks
 WHERE task_id IN %(task_ids)s

-- name: claim_application_window
UPDATE applications
   SET start_window_s = %(window_s)s, start_window_count = %(window_count)s
 WHERE application_id = %(application_id)s

-- name: claim_queue_window
UPDATE queues
   SET start_window_s = %(window_s)s, start_window_count = %(window_count)s
 WHERE queue_id = %(queue_id)s

-- ---------------------------------------------------------------------------------
-- Transitions: start, renew, finish, release
-- ---------------------------------------------------------------------------------

-- The compare-and-set read of every transition: the rows are locked (waiting if a claim
-- or the sweeper holds them, briefly) and judged with this statement's NOW(6).
-- name: transition_lock
SELECT task_id, namespace_id, queue_id, state, fencing_token, cancel_requested, resource_key,
       attempts, max_attempts, backoff_initial_ms, backoff_max_ms, backoff_multiplier, deadline,
       lease_expires_at,
       (lease_expires_at IS NOT NULL AND lease_expires_at > NOW(6)) AS lease_valid,
       (deadline IS NOT NULL AND deadline <= NOW(6)) AS past_deadline,
       NOW(6) AS now
  FROM tasks
 WHERE task_id IN %(task_ids)s
   FOR UPDATE

-- Attempts named by (task id, token): how an older or repeated transition is answered.
-- name: transition_attempts
SELECT task_id, fencing_token, outcome, started_at
  FROM task_attempts
 WHERE task_id IN %(task_ids)s
   AND (task_id, fencing_token) IN %(pairs)s

-- reserved -> running. Like every transition write, a single-table UPDATE by primary key:
-- a multi-table UPDATE needs an internal temporary table of the rows to change, and
-- MariaDB 10.11 has crashed when creating one failed (docs/operations.md). Each names
-- its index: with a long IN list over a small table the optimizer would rather scan the
-- whole table.
-- name: start_tasks
UPDATE tasks FORCE INDEX (PRIMARY)
   SET state = 'running',
       attempts = attempts + 1,
       started_at = %(now)s,
       lease_expires_at = %(lease_expires_at)s
 WHERE task_id IN %(task_ids)s
   AND state = 'reserved'

-- The attempt started: the one of the task's current token (%(attempts)s, as in
-- settle_attempts).
-- name: start_attempts
UPDATE task_attempts FORCE INDEX (uq_attempts_token)
   SET started_at = %(now)s
 WHERE task_id IN %(task_ids)s
   AND CONCAT(task_id, ' ', fencing_token) IN %(attempts)s

-- name: renew_tasks
UPDATE tasks
   SET lease_expires_at = %(lease_expires_at)s
 WHERE task_id IN %(task_ids)s

-- A running task's new connection (attach): where its Worker is now, for explain and the
-- console. Ownership stays with the token.
-- name: attach_tasks
UPDATE tasks FORCE INDEX (PRIMARY)
   SET owner_node_id = %(node_id)s,
       connection_id = %(connection_id)s
 WHERE task_id IN %(task_ids)s

-- The settle statements take values per task (orbit_node.db.tx.per_row_statement):
-- %(row_keys)s are the task ids, and {column} is the value most of them have, with a
-- CASE task_id WHEN ... THEN ... branch for each task whose value differs. Column names
-- are those of Writes in orbit_node/store/transitions.py.

-- Terminal states. The fencing token stays on the row, so a late Start/Finish of that
-- attempt can be told what happened to it.
-- name: settle_terminal
UPDATE tasks FORCE INDEX (PRIMARY)
   SET state = {state},
       result = {result},
       error = {error},
       finished_at = NOW(6),
       lease_expires_at = NULL
 WHERE task_id IN %(row_keys)s

-- Back to the queue (release, expired reservation, retry): a NULL available_at keeps
-- it, a NULL error keeps the last one. dispatch_at is generated from available_at and
-- follows by itself; priority never changes.
-- name: settle_requeue
UPDATE tasks FORCE INDEX (PRIMARY)
   SET state = 'queued',
       available_at = COALESCE(CAST({available_at} AS DATETIME(6)), available_at),
       error = COALESCE({error}, error),
       owner_node_id = NULL,
       connection_id = NULL,
       fencing_token = NULL,
       lease_expires_at = NULL
 WHERE task_id IN %(row_keys)s

-- The attempts closed with the rows settled or requeued (or alone): each named by its
-- task and the token given (the attempt of that token, not of the task's column), and
-- only while it is open. %(attempts)s: 'task_id token' of each, one flat IN list, which
-- the server searches by bisection ((task_id, fencing_token) IN pairs is compared with
-- every pair in turn).
-- name: settle_attempts
UPDATE task_attempts FORCE INDEX (uq_attempts_token)
   SET outcome = {outcome},
       error = {error},
       finished_at = NOW(6)
 WHERE task_id IN %(row_keys)s
   AND CONCAT(task_id, ' ', fencing_token) IN %(attempts)s
   AND outcome IS NULL

-- name: settle_release_keys
UPDATE resource_keys
   SET holder_task_id = NULL
 WHERE (namespace_id, resource_key) IN %(keys)s
   AND holder_task_id IN %(task_ids)s

-- The further holders among the settled tasks (000028): %(holders)s are their
-- (namespace, key, task) triples.
-- name: settle_release_holders
DELETE FROM resource_key_holders
 WHERE (namespace_id, resource_key, task_id) IN %(holders)s

-- ---------------------------------------------------------------------------------
-- Recovery (any node, concurrently): non-locking candidate reads, then lock by primary
-- key with SKIP LOCKED and re-check the condition with NOW(6).
-- ---------------------------------------------------------------------------------

-- name: recover_lease_candidates
SELECT task_id, application_id
  FROM tasks FORCE INDEX (ix_tasks_lease)
 WHERE state IN ('reserved', 'running')
   AND lease_expires_at <= NOW(6)
 LIMIT %(limit)s

-- name: recover_deadline_candidates
SELECT task_id, application_id
  FROM tasks FORCE INDEX (ix_tasks_deadline)
 WHERE state = 'queued'
   AND deadline <= NOW(6)
 LIMIT %(limit)s

-- name: recover_lock
SELECT task_id, namespace_id, queue_id, state, fencing_token, cancel_requested, resource_key,
       attempts, max_attempts, backoff_initial_ms, backoff_max_ms, backoff_multiplier, deadline,
       lease_expires_at, FALSE AS lease_valid,
       (deadline IS NOT NULL AND deadline <= NOW(6)) AS past_deadline,
       NOW(6) AS now
  FROM tasks
 WHERE application_id = %(application_id)s
   AND task_id IN %(task_ids)s
   AND (   (state IN ('reserved', 'running') AND lease_expires_at <= NOW(6))
        OR (state = 'queued' AND deadline <= NOW(6)))
   FOR UPDATE SKIP LOCKED

-- ---------------------------------------------------------------------------------
-- Explanation (read only)
-- ---------------------------------------------------------------------------------

-- name: explain_task
SELECT task_id, queue_id, namespace_id, application_id, handler, handler_version,
       payload_version, state, priority, available_at, dispatch_at, deadline,
       attempts, max_attempts, resource_key, cancel_requested, owner_node_id,
       connection_id, lease_expires_at
  FROM tasks
 WHERE task_id = %(task_id)s
   AND namespace_id = %(namespace_id)s

-- The gates and quotas of queues of a namespace (with their application's) and the
-- database clock: what an explanation, or the waiting reasons of a listing's queued
-- tasks, hold a task against.
-- name: explain_queue_gates
SELECT q.queue_id, q.application_id, q.name AS queue_name, q.paused AS queue_paused,
       q.max_concurrency AS queue_max_concurrency, q.max_starts_per_second AS queue_max_starts,
       q.max_running_per_key AS queue_max_running_per_key,
       q.start_window_s AS queue_window_s, q.start_window_count AS queue_window_count,
       a.suspended AS app_suspended, a.max_concurrent_executions AS app_max_concurrent,
       a.max_starts_per_second AS app_max_starts, a.start_window_s AS app_window_s,
       a.start_window_count AS app_window_count,
       NOW(6) AS now, UNIX_TIMESTAMP() AS now_s
  FROM queues q
  JOIN applications a ON a.application_id = q.application_id
 WHERE q.namespace_id = %(namespace_id)s
   AND q.queue_id IN %(queue_ids)s

-- The holders of one resource key still reserved or running: its first holder and the
-- further ones (000028), each once. The few holder ids first, then their tasks by
-- primary key (never a range of the tasks' states).
-- name: explain_key_holders
SELECT t.task_id
  FROM (SELECT holder_task_id AS task_id
          FROM resource_keys
         WHERE namespace_id = %(namespace_id)s AND resource_key = %(resource_key)s
        UNION
        SELECT task_id
          FROM resource_key_holders
         WHERE namespace_id = %(namespace_id)s AND resource_key = %(resource_key)s) h
  STRAIGHT_JOIN tasks t FORCE INDEX (PRIMARY) ON t.task_id = h.task_id
 WHERE t.state IN ('reserved', 'running')
 ORDER BY t.task_id

-- Due queued tasks of the queue ahead of this one in dispatch order (any handler, and
-- of this task's handler capability), counted up to %(cap)s index entries.
-- name: explain_position
SELECT COUNT(*) AS ahead, COALESCE(SUM(same_capability), 0) AS ahead_same_capability
  FROM (SELECT (handler = %(handler)s AND handler_version = %(handler_version)s
                AND payload_version = %(payload_version)s) AS same_capability
          FROM tasks FORCE INDEX (ix_tasks_dispatch)
         WHERE queue_id = %(queue_id)s
           AND state = 'queued'
           AND dispatch_at <= %(dispatch_at)s
           AND available_at <= NOW(6)
           AND (dispatch_at, available_at, task_id) < (%(dispatch_at)s, %(available_at)s, %(task_id)s)
         LIMIT %(cap)s) ahead

-- Worker connections registered in the namespace; alive while their node refreshes the
-- registry heartbeat and has not stopped.
-- name: explain_holder
-- The connection a reserved or running task belongs to, and its node: whether the
-- registry still has the connection, and the node's last heartbeat and stop.
SELECT n.node_id, n.heartbeat_at, n.stopped_at,
       (n.heartbeat_at > NOW(6) - INTERVAL %(stale_s)s SECOND AND n.stopped_at IS NULL) AS node_alive,
       (SELECT COUNT(*) FROM worker_connections wc WHERE wc.connection_id = %(connection_id)s) AS registered
  FROM (SELECT 1 AS one) x
  LEFT JOIN nodes n ON n.node_id = %(node_id)s

-- name: explain_workers
SELECT wc.connection_id, wc.node_id, wc.queues, wc.capabilities, wc.resource_key_support,
       (wc.heartbeat_at > NOW(6) - INTERVAL %(stale_s)s SECOND AND n.stopped_at IS NULL) AS alive
  FROM worker_connections wc
  LEFT JOIN nodes n ON n.node_id = wc.node_id
 WHERE wc.namespace_id = %(namespace_id)s
