-- orbit: compatible
-- At most N tasks of one resource key reserved or running at once, N being the control
-- max_running_per_key of the task's queue (1-1000; 1, the default, is one at a time, as
-- before). docs/dispatch.md, "Resource keys".
--
-- The key's row in resource_keys stays its mutex and its first holder (holder_task_id):
-- a claim locks it with SKIP LOCKED, counts the key's live holders (that one and the
-- rows below) and takes what is left. resource_key_holders has one row per further
-- holder, written by the claim that reserves the task, deleted by the transition that
-- settles or requeues it. A claim fills holder_task_id when it is free and adds a
-- further holder only while it is held.
--
-- Compatible (the line above): a new column of queues, added instantly (no rebuild; the
-- writers check its range, as for 000022's columns: a CHECK would copy the table), and a
-- new table. A node of the version before it sees a key as held while holder_task_id is,
-- and takes a key only by filling it: one at a time for its own claims. While N stays as
-- it is, the key never has more than N holders whichever nodes claim: a further holder is
-- added only while holder_task_id is held and fewer than N hold the key, so at most N - 1
-- further holders exist, and an older node filling a freed holder_task_id makes N at
-- most. Lowering N while such a node runs is the exception: it may still fill a freed
-- holder_task_id while the further holders drain (never beyond the former N). Such a node
-- settles a further holder without deleting its row; the row counts only while its task
-- is reserved or running again, that is while it holds the key again.
ALTER TABLE queues
  ADD COLUMN max_running_per_key SMALLINT NOT NULL DEFAULT 1
    COMMENT 'reserved + running tasks of one resource key at once, 1-1000 (tasks of every queue naming the key count)'
    AFTER max_starts_per_second,
  ALGORITHM=INSTANT;

CREATE TABLE resource_key_holders (
  namespace_id CHAR(32)     NOT NULL,
  resource_key VARCHAR(255) NOT NULL,
  task_id      CHAR(32)     NOT NULL COMMENT 'a reserved/running task holding the key besides resource_keys.holder_task_id',
  created_at   DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (namespace_id, resource_key, task_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
