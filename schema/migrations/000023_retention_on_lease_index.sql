-- Retention's reads move onto an index every transition already rewrites, so a task's
-- life costs the database no index operation for retention (docs/operations.md,
-- "Retention"; bench/README.md, "mariadbd CPU per task").
--
-- 000021 gave the pruner ix_tasks_retention (application_id, retention_class,
-- finished_at) over a virtual retention_class. Measured, every task then cost mariadbd
-- about 7 % more CPU: one more index entry written at acceptance and moved at the Finish,
-- and the virtual column evaluated at each change of state. ix_tasks_lease (state,
-- lease_expires_at) is rewritten by every change of state anyway, and a finished task's
-- lease is always NULL (each terminal transition clears it; a queued task has none), so
-- the entries of finished tasks form, per state, the range (state, NULL, application_id,
-- finished_at) once the index carries those two columns: the expired tasks of an
-- application lead it, oldest first, and no live task is in it.
--
-- Online: the index is rebuilt in place while reads and writes go on (ALGORITHM=INPLACE,
-- LOCK=NONE fails rather than lock the table), and the virtual column, which stores
-- nothing, is dropped without a rebuild. Rebuilding the index reads the whole table once:
-- on a database with millions of tasks, expect about a minute per few million rows.
ALTER TABLE tasks
  DROP INDEX ix_tasks_lease,
  ADD INDEX ix_tasks_lease (state, lease_expires_at, application_id, finished_at),
  DROP INDEX ix_tasks_retention,
  ALGORITHM=INPLACE, LOCK=NONE;

ALTER TABLE tasks
  DROP COLUMN retention_class,
  ALGORITHM=INSTANT;
