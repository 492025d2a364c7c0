-- Retention: the pruner (orbit_node.store.pruning) and what operators read of it.
--
-- A task is expired when it is terminal (succeeded; failed, cancelled or expired) and
-- finished_at < NOW(6) - its application's retention for that outcome. Every read goes
-- through ix_tasks_lease (state, lease_expires_at, application_id, finished_at), 000023:
-- a finished task's lease is always NULL, so (state = one terminal state, lease NULL,
-- application_id) is a range of that application's finished tasks in finished_at order.
-- Its expired rows lead the range, so a prune reads what it deletes, and no live task is
-- in it. The index is the one every transition already rewrites: retention adds no index
-- operation to a task's life.
--
-- Each read names one state with an equality, never state IN (...): MariaDB 10.11.19 was
-- seen to return no rows at all for "class IN (1, 2) AND finished_at > ? ORDER BY
-- finished_at" once it chose a ref on application_id with a filesort (after rows had been
-- deleted; bench/README.md); a range read of one value was right every time. The states
-- of an outcome are read as one range each and merged (UNION ALL, then ORDER BY).
--
-- Any number of nodes prune at once: the candidates, read without locks, are locked by
-- primary key with SKIP LOCKED (a row another pruner, or a late transition, holds is
-- left for the next batch) and deleted by primary key in the same short transaction. At
-- READ COMMITTED no gap is locked, so a Finish adding a row to the end of the range never
-- waits for a pruner.

-- Every application of this database with its own retention (NULL: the node's default).
-- name: retention_applications
SELECT application_id, name, retain_succeeded_s, retain_failed_s
  FROM applications
 ORDER BY application_id

-- One batch of expired tasks of an (application, outcome), oldest first, read without
-- locking anything: one branch per terminal state of the outcome (%(state_{i})s),
-- merged by prune_candidates_order. overdue_s: how long past its retention each one is
-- (the pruner's lag). Not a locking read of the range: InnoDB would also lock, for a
-- moment, the first entry past it, which can be another application's task, and a
-- claim's SKIP LOCKED would pass such a task over: a claim took the second task of a
-- queue instead of the first (tests/integration/test_worker_connection_abuse.py).
-- name: prune_candidates_branch
(SELECT task_id, finished_at,
        TIMESTAMPDIFF(MICROSECOND, finished_at, NOW(6) - INTERVAL %(keep_s)s SECOND) / 1000000 AS overdue_s
   FROM tasks FORCE INDEX (ix_tasks_lease)
  WHERE state = %(state_{i})s
    AND lease_expires_at IS NULL
    AND application_id = %(application_id)s
    AND finished_at < NOW(6) - INTERVAL %(keep_s)s SECOND
  ORDER BY finished_at
  LIMIT %(limit)s)

-- name: prune_candidates_order
ORDER BY finished_at
LIMIT %(limit)s

-- Then exactly those rows are locked, by primary key, skipping what another pruner (or a
-- late transition) holds; that the task is finished is checked again on the locked row.
-- A parent stays while one of its children (000027) has not finished: the child waits
-- for it, or its handler may still read the parent's result.
-- name: prune_lock
SELECT t.task_id
  FROM tasks t FORCE INDEX (PRIMARY)
 WHERE t.task_id IN %(task_ids)s
   AND t.state IN ('succeeded', 'failed', 'cancelled', 'expired')
   AND NOT EXISTS (SELECT 1
                     FROM task_parents p FORCE INDEX (ix_task_parents_parent)
                     JOIN tasks c FORCE INDEX (PRIMARY) ON c.task_id = p.child_task_id
                    WHERE p.parent_task_id = t.task_id
                      AND c.state IN ('waiting', 'queued', 'reserved', 'running'))
   FOR UPDATE SKIP LOCKED

-- What belongs to the locked tasks: their attempts, and their acceptance records (an
-- Idempotency-Key, a batch item's key, or a plan's fire record). Each DELETE names its
-- index (the one-table form of the multi-table syntax takes a hint): over a small table
-- the optimizer would rather scan it all, locking rows another pruner holds.
-- name: prune_attempts
DELETE a FROM task_attempts a FORCE INDEX (uq_attempts_token) WHERE a.task_id IN %(task_ids)s

-- name: prune_records
DELETE r FROM idempotency_records r FORCE INDEX (ix_idempotency_records_task) WHERE r.task_id IN %(task_ids)s

-- name: prune_trace_contexts
DELETE c FROM task_trace_contexts c FORCE INDEX (PRIMARY) WHERE c.task_id IN %(task_ids)s

-- Their edges as children (000027; an edge to a parent belongs to the child), and a
-- parent's dependency_failures row the sweep has not consumed yet.
-- name: prune_task_parents
DELETE p FROM task_parents p FORCE INDEX (PRIMARY) WHERE p.child_task_id IN %(task_ids)s

-- name: prune_dependency_failures
DELETE f FROM dependency_failures f FORCE INDEX (PRIMARY) WHERE f.parent_task_id IN %(task_ids)s

-- The tasks themselves; the state condition is a guard: a live task is never deleted.
-- name: prune_tasks
DELETE t FROM tasks t FORCE INDEX (PRIMARY)
 WHERE t.task_id IN %(task_ids)s AND t.state IN ('succeeded', 'failed', 'cancelled', 'expired')

-- Audit records older than their retention, oldest first (ix_audit_records_time).
-- name: prune_audit_candidates
SELECT audit_id
  FROM audit_records FORCE INDEX (ix_audit_records_time)
 WHERE recorded_at < NOW(6) - INTERVAL %(keep_s)s SECOND
 ORDER BY recorded_at
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED

-- name: prune_audit
DELETE r FROM audit_records r FORCE INDEX (PRIMARY) WHERE r.audit_id IN %(audit_ids)s

-- What retention deletes next for an (application, terminal state), read only: how many
-- tasks have expired (counted up to %(cap)s index entries), the oldest of them, and when
-- the first task not yet expired will be. The caller adds up the states of an outcome.
-- name: retention_due
SELECT (SELECT COUNT(*) FROM (SELECT 1
                                FROM tasks FORCE INDEX (ix_tasks_lease)
                               WHERE state = %(state)s
                                 AND lease_expires_at IS NULL
                                 AND application_id = %(application_id)s
                                 AND finished_at < NOW(6) - INTERVAL %(keep_s)s SECOND
                               LIMIT %(cap)s) expired) AS expired,
       (SELECT MIN(finished_at)
          FROM tasks FORCE INDEX (ix_tasks_lease)
         WHERE state = %(state)s
           AND lease_expires_at IS NULL
           AND application_id = %(application_id)s) AS oldest_finished_at,
       (SELECT MIN(finished_at) + INTERVAL %(keep_s)s SECOND
          FROM tasks FORCE INDEX (ix_tasks_lease)
         WHERE state = %(state)s
           AND lease_expires_at IS NULL
           AND application_id = %(application_id)s
           AND finished_at >= NOW(6) - INTERVAL %(keep_s)s SECOND) AS next_expiry_at,
       NOW(6) AS now

-- Change only the retention fields the caller names (flags), as ops_app_patch_quota.
-- name: ops_app_patch_retention
UPDATE applications
   SET retain_succeeded_s = IF(%(set_retain_succeeded_s)s, %(retain_succeeded_s)s, retain_succeeded_s),
       retain_failed_s = IF(%(set_retain_failed_s)s, %(retain_failed_s)s, retain_failed_s)
 WHERE application_id = %(application_id)s
