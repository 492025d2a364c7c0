-- Bounded claims: one ordered index range per (capability, resource-keyed or not,
-- priority level). Inside such a range every row up to NOW(6) - 30 s x priority is due
-- and runnable by the claiming connection, so a claim reads about what it takes,
-- whatever else the queue holds: due tasks of other handlers or versions, tasks inside
-- the priority window (dispatch_at <= now < available_at), resource-keyed tasks for a
-- connection without key support. ix_tasks_dispatch stays for the whole-queue reads
-- (explain, operations, quota counts).
ALTER TABLE tasks
  ADD COLUMN keyed TINYINT(1)
    GENERATED ALWAYS AS (resource_key IS NOT NULL) VIRTUAL
    COMMENT '1 when the task names a resource key; claim index only';

CREATE INDEX ix_tasks_claim ON tasks
  (queue_id, state, handler, handler_version, payload_version, keyed, priority, dispatch_at, task_id);
