-- Retrying a finished task, and finding tasks by filter (docs/api.md, "Retry" and "Listing").
--
-- A retry is a new task linked to the one it retries: retried_from holds the old task's id
-- (NULL for every other task). The old task keeps its one terminal state for ever. The
-- UNIQUE index lets a task be retried at most once, so a second retry of it (a repeated
-- request, two operators at once, two nodes) finds the first one's task instead of
-- creating another.
ALTER TABLE tasks
  ADD COLUMN retried_from CHAR(32) NULL
    COMMENT 'the failed, cancelled or expired task this task retries; NULL for a task accepted from a request or a plan',
  ADD UNIQUE KEY ux_tasks_retried_from (retried_from);

-- Listings and bulk actions page newest first by (created_at, task_id): the database
-- clock's acceptance time, then the id within one acceptance transaction. Each index
-- below gives that order inside one namespace, so a page reads about as many index
-- entries as it returns and never sorts:
-- * without a state filter: (namespace_id, created_at, task_id), which replaces the
--   (namespace_id, task_id) index of the old listing order;
-- * per state: ix_tasks_app_state grows by (namespace_id, created_at, task_id). Its
--   (application_id, state) prefix still serves the per-application live counts of the
--   claim, and no index is added that a state change has to update.
ALTER TABLE tasks
  DROP INDEX ix_tasks_ns_task,
  ADD INDEX ix_tasks_ns_created (namespace_id, created_at, task_id),
  DROP INDEX ix_tasks_app_state,
  ADD INDEX ix_tasks_app_state (application_id, state, namespace_id, created_at, task_id);
