-- P3: task priority 0-9 and the generated dispatch ordering time.
-- Apply after stopping the old writers; existing tasks get priority 0, so their
-- dispatch_at equals their available_at and nothing else changes.
ALTER TABLE tasks
  ADD COLUMN priority SMALLINT NOT NULL DEFAULT 0
    COMMENT 'priority fixed at acceptance, 0-9; each level buys at most 30 s of ordering advantage',
  ADD CONSTRAINT ck_tasks_priority CHECK (priority BETWEEN 0 AND 9);

ALTER TABLE tasks
  ADD COLUMN dispatch_at DATETIME(6)
    GENERATED ALWAYS AS (available_at - INTERVAL (priority * 30) SECOND) STORED
    COMMENT 'dispatch ordering time = available_at - priority * 30 s; read-only, ordering only, grants no execution right (available_at stays the earliest execution time)';

CREATE INDEX ix_tasks_dispatch ON tasks (queue_id, state, dispatch_at, available_at, task_id);
