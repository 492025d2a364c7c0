-- Signals between nodes (docs/scheduling.md, "Signals between nodes"): a node that
-- accepts or requeues tasks for a queue, or is asked to cancel a task another node's
-- Worker holds, appends one row; every node with Worker connections reads the rows after
-- the last one it saw, a single primary-key range read on a short adaptive interval, and
-- wakes that queue's waiting claims (or pushes the cancel). A latency shortcut only: a
-- signal never read costs at most one scan cycle, and nothing is decided from this table.
-- Rows are pruned a minute after they were written; no row is kept per reading node.
CREATE TABLE node_signals (
  signal_id      BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  origin_node_id CHAR(32)        NOT NULL COMMENT 'the node that wrote it',
  kind           VARCHAR(16)     NOT NULL COMMENT 'tasks: tasks due (or coming due) in queue_id; cancel: cancel asked for task_id',
  queue_id       CHAR(32)        NULL,
  task_id        CHAR(32)        NULL,
  due_at         DATETIME(6)     NULL COMMENT 'tasks: when they come due (database clock); NULL: due now',
  created_at     DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (signal_id),
  KEY ix_node_signals_created (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
