-- Retention (docs/operations.md, "Retention"): finished tasks are deleted, with what
-- belongs to them, once their application's retention for their outcome has passed.
--
-- Every statement here is online: adding columns is instant (no table rebuild) and both
-- indexes are built in place while reads and writes go on (ALGORITHM=INPLACE,
-- LOCK=NONE: the statement fails rather than lock a table if the server cannot do that).
-- Building an index reads the whole table once: on a database with millions of tasks,
-- expect about a minute per few million rows.
--
-- Per application, by outcome: NULL takes the node's default (ORBIT_RETAIN_SUCCEEDED,
-- ORBIT_RETAIN_FAILED). Seconds, at least 1: the writers check it (a CHECK constraint
-- added here would make the server copy the table).
ALTER TABLE applications
  ADD COLUMN retain_succeeded_s INT NULL
    COMMENT 'a succeeded task is deleted this many seconds after it finished; NULL: the node default' AFTER fairness_weight,
  ADD COLUMN retain_failed_s INT NULL
    COMMENT 'a failed, cancelled or expired task is deleted this many seconds after it finished; NULL: the node default' AFTER retain_succeeded_s,
  ALGORITHM=INSTANT;

-- Which retention a task's row falls under: 1 succeeded, 2 failed/cancelled/expired, NULL
-- while it is queued, reserved or running. Virtual (nothing stored in the row).
ALTER TABLE tasks
  ADD COLUMN retention_class TINYINT
    GENERATED ALWAYS AS (CASE state WHEN 'succeeded' THEN 1 WHEN 'failed' THEN 2
                                    WHEN 'cancelled' THEN 2 WHEN 'expired' THEN 2 END) VIRTUAL
    COMMENT '1 succeeded, 2 failed/cancelled/expired, NULL live; retention index only',
  ALGORITHM=INSTANT;

-- The pruner's index: per application and outcome class, finished tasks oldest first. A
-- prune reads exactly the rows it deletes (the expired ones lead each range) and never
-- a live task (class NULL). Its entry changes once in a task's life, when it finishes:
-- retention_class and finished_at stay NULL through queued, reserved and running
-- (claim, Start and requeue change neither), so those transitions do not touch it.
ALTER TABLE tasks
  ADD INDEX ix_tasks_retention (application_id, retention_class, finished_at),
  ALGORITHM=INPLACE, LOCK=NONE;

-- An acceptance record (Idempotency-Key or plan fire) found by its task, to be deleted
-- with it.
ALTER TABLE idempotency_records
  ADD INDEX ix_idempotency_records_task (task_id),
  ALGORITHM=INPLACE, LOCK=NONE;
