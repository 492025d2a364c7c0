-- Who did what: one row per write an operator makes through the console (cancel or retry
-- a task, pause or resume a queue, cancel or retry the tasks a filter matches), read on
-- the console's audit page and by `orbit-admin audit list` (docs/operations.md, "The
-- console"). A row is written after the action it records, by the node that took it, on
-- the database of the application's shard. Nothing reads it to decide anything.
CREATE TABLE audit_records (
  audit_id       BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  recorded_at    DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6) COMMENT 'database clock',
  application_id CHAR(32)        NOT NULL,
  namespace_id   CHAR(32)        NOT NULL,
  credential_id  CHAR(32)        NOT NULL COMMENT 'who: the credential the action was taken with',
  via            VARCHAR(16)     NOT NULL COMMENT 'where: console (the only writer so far)',
  action         VARCHAR(32)     NOT NULL COMMENT 'task.cancel, task.retry, queue.pause, queue.resume, tasks.bulk_cancel, tasks.bulk_retry',
  queue_id       CHAR(32)        NULL COMMENT 'the queue acted on or filtered by; NULL: no single queue',
  task_id        CHAR(32)        NULL COMMENT 'the task acted on, for an action on one task',
  filter         TEXT            NULL COMMENT 'JSON object: the filter of an action on many tasks',
  changed        INT             NOT NULL COMMENT 'how many tasks or queues the action changed (0: nothing to do)',
  outcome        VARCHAR(255)    NOT NULL COMMENT 'what came of it, in words',
  PRIMARY KEY (audit_id),
  KEY ix_audit_records_ns (namespace_id, audit_id),
  KEY ix_audit_records_time (recorded_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
