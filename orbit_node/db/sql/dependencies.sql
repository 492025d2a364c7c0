-- Dependencies between tasks (000027; store/dependencies.py). The acceptance side
-- (dependency_parents_lock, dependency_edges_insert, dependency_waits_insert) is in
-- tasks.sql beside task_insert.

-- The children of the tasks a Finish locked: read in the lock's round trip, after the
-- lock (a child accepted meanwhile held its parents shared, so it has committed by then).
-- name: dependency_children
SELECT parent_task_id, child_task_id
  FROM task_parents FORCE INDEX (ix_task_parents_parent)
 WHERE parent_task_id IN %(task_ids)s

-- The counts of the children of parents that succeeded, locked in id order, with what a
-- release needs.
-- name: dependency_waits_lock
SELECT w.task_id, w.parents_left, t.state, t.queue_id, t.available_at, NOW(6) AS now
  FROM task_waits w FORCE INDEX (PRIMARY)
  JOIN tasks t FORCE INDEX (PRIMARY) ON t.task_id = w.task_id
 WHERE w.task_id IN %(task_ids)s
 ORDER BY w.task_id
   FOR UPDATE

-- name: dependency_waits_count
UPDATE task_waits FORCE INDEX (PRIMARY)
   SET parents_left = {parents_left}
 WHERE task_id IN %(row_keys)s

-- Released: queued, available at the later of its own time and now (dispatch_at follows).
-- name: dependency_release
UPDATE tasks FORCE INDEX (PRIMARY)
   SET state = 'queued', available_at = GREATEST(available_at, NOW(6))
 WHERE task_id IN %(task_ids)s AND state = 'waiting'

-- name: dependency_waits_delete
DELETE w FROM task_waits w FORCE INDEX (PRIMARY) WHERE w.task_id IN %(task_ids)s

-- Tasks that ended without success and have children: the cascade's work list.
-- name: dependency_failures_insert
INSERT IGNORE INTO dependency_failures (parent_task_id)
SELECT DISTINCT parent_task_id
  FROM task_parents FORCE INDEX (ix_task_parents_parent)
 WHERE parent_task_id IN %(task_ids)s

-- name: dependency_failures_next
SELECT parent_task_id FROM dependency_failures ORDER BY created_at, parent_task_id LIMIT %(limit)s

-- The row of one failed parent, skipped when another node's cascade holds it, with the
-- parent's state (NULL: the parent is gone).
-- name: dependency_failure_lock
SELECT f.parent_task_id, t.state
  FROM dependency_failures f FORCE INDEX (PRIMARY)
  LEFT JOIN tasks t FORCE INDEX (PRIMARY) ON t.task_id = f.parent_task_id
 WHERE f.parent_task_id = %(parent_task_id)s
   FOR UPDATE SKIP LOCKED

-- name: dependency_children_waiting
SELECT c.task_id
  FROM task_parents p FORCE INDEX (ix_task_parents_parent)
  JOIN tasks c FORCE INDEX (PRIMARY) ON c.task_id = p.child_task_id
 WHERE p.parent_task_id = %(parent_task_id)s AND c.state = 'waiting'
 ORDER BY c.task_id
 LIMIT %(limit)s
   FOR UPDATE

-- name: dependency_cancel
UPDATE tasks FORCE INDEX (PRIMARY)
   SET state = 'cancelled', error = %(error)s, finished_at = NOW(6)
 WHERE task_id IN %(task_ids)s AND state = 'waiting'

-- name: dependency_failure_delete
DELETE FROM dependency_failures WHERE parent_task_id = %(parent_task_id)s

-- Reads: a task's parents with their states (NULL: gone), and its children.
-- name: dependency_parents_of
SELECT p.child_task_id, p.parent_task_id, t.state
  FROM task_parents p FORCE INDEX (PRIMARY)
  LEFT JOIN tasks t FORCE INDEX (PRIMARY) ON t.task_id = p.parent_task_id
 WHERE p.child_task_id IN %(task_ids)s
 ORDER BY p.child_task_id, p.parent_task_id

-- name: dependency_children_of
SELECT p.child_task_id AS task_id, t.state
  FROM task_parents p FORCE INDEX (ix_task_parents_parent)
  LEFT JOIN tasks t FORCE INDEX (PRIMARY) ON t.task_id = p.child_task_id
 WHERE p.parent_task_id = %(task_id)s AND p.child_task_id > %(after)s
 ORDER BY p.child_task_id
 LIMIT %(limit)s
