-- orbit-admin task export: an application's finished tasks, oldest finished_at first,
-- read a page at a time (docs/operations.md, "Exporting finished tasks").

-- One outcome class (1 succeeded, 2 failed/cancelled/expired: tasks.retention_class) of
-- the page: the next %(limit)s entries of ix_tasks_retention after the cursor
-- (%(after_at)s, %(after_id)s; NULL on the first page), a range of the index in its own
-- order (finished_at, then the primary key it ends with), so nothing is sorted and no
-- task row is read. Live tasks have no class and are not in the range.
-- name: export_page_branch
(SELECT task_id, finished_at
   FROM tasks FORCE INDEX (ix_tasks_retention)
  WHERE application_id = %(application_id)s
    AND retention_class = %(retention_class_{i})s
    AND finished_at < %(finished_before)s
    AND (%(finished_after)s IS NULL OR finished_at >= %(finished_after)s)
    AND (%(after_at)s IS NULL OR finished_at > %(after_at)s OR (finished_at = %(after_at)s AND task_id > %(after_id)s))
  ORDER BY finished_at, task_id
  LIMIT %(limit)s)

-- The two classes' ranges merged: at most twice %(limit)s entries are sorted.
-- name: export_page_order
ORDER BY finished_at, task_id
LIMIT %(limit)s
