-- orbit: compatible
-- Tasks that wait for other tasks (docs/api.md, "Dependencies").
--
-- A task submitted with depends_on names up to 100 parents of its application. While a
-- parent has not succeeded the task is `waiting`: never claimed, counted in task_waits.
-- The Finish that makes its last parent succeed moves it to `queued`, in the same
-- transaction; a parent that ends failed, cancelled or expired leaves a row in
-- dependency_failures, and the node cancels the parent's waiting children from it in
-- bounded transactions (and theirs, level by level).
--
-- The new state: the CHECK of 000005 listed the states. MariaDB drops a CHECK constraint
-- in place (metadata only) but adds one only by copying the table, writes blocked for as
-- long as tasks takes to copy; so the state list is the code's (task_query.STATES), not
-- the table's.
--
-- Compatible (the first line): nodes of the version before it claim, list and settle
-- only the states they know, so they never run a waiting task. They neither release one
-- (a parent finished by such a node leaves its children waiting) nor keep a parent from
-- retention while its children wait: finish a rolling upgrade before the first task
-- with depends_on is submitted (docs/operations.md, "Upgrades").
ALTER TABLE tasks DROP CONSTRAINT ck_tasks_state, ALGORITHM=INSTANT;

-- Every edge, kept for the child's life: what explain, the task API and the dispatch
-- read. By child (its parents), and by parent (the children a Finish releases).
CREATE TABLE task_parents (
  child_task_id  CHAR(32) NOT NULL,
  parent_task_id CHAR(32) NOT NULL,
  PRIMARY KEY (child_task_id, parent_task_id),
  KEY ix_task_parents_parent (parent_task_id, child_task_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One row per waiting task: how many of its parents have not succeeded yet. Gone when
-- the task is released or cancelled.
CREATE TABLE task_waits (
  task_id      CHAR(32) NOT NULL,
  parents_left INT      NOT NULL COMMENT 'parents that have not succeeded; released at 0',
  PRIMARY KEY (task_id),
  CONSTRAINT ck_task_waits_left CHECK (parents_left >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Parents that ended without success while they may have waiting children: the work list
-- of the node's dependency sweep (each row is deleted once none of its children waits).
CREATE TABLE dependency_failures (
  parent_task_id CHAR(32)    NOT NULL,
  created_at     DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (parent_task_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
