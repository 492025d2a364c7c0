-- orbit-admin task export: an application's finished tasks, oldest finished_at first,
-- read a page at a time (docs/operations.md, "Exporting finished tasks").

-- One terminal state (%(state_{i})s) of the page: the next %(limit)s entries of
-- ix_tasks_lease (state, lease_expires_at, application_id, finished_at) after the cursor
-- (%(after_at)s, %(after_id)s; NULL on the first page). A finished task's lease is always
-- NULL, so this is a range of the index in its own order (finished_at, then the primary
-- key it ends with): nothing is sorted and no task row is read. Live tasks are not in it.
-- name: export_page_branch
(SELECT task_id, finished_at
   FROM tasks FORCE INDEX (ix_tasks_lease)
  WHERE state = %(state_{i})s
    AND lease_expires_at IS NULL
    AND application_id = %(application_id)s
    AND finished_at < %(finished_before)s
    AND (%(finished_after)s IS NULL OR finished_at >= %(finished_after)s)
    AND (%(after_at)s IS NULL OR finished_at > %(after_at)s OR (finished_at = %(after_at)s AND task_id > %(after_id)s))
  ORDER BY finished_at, task_id
  LIMIT %(limit)s)

-- The four states' ranges merged: at most four times %(limit)s entries are sorted.
-- name: export_page_order
ORDER BY finished_at, task_id
LIMIT %(limit)s
