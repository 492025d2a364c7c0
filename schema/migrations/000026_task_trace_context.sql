-- orbit: compatible
-- The W3C trace context a task was submitted with (its traceparent, then a space and its
-- tracestate when there was one), sent with each of its dispatches so that the Worker's
-- span continues the producer's trace (docs/operations.md, "Tracing"); a retry copies it.
-- A task submitted without one (or created by a plan) has no row.
--
-- A table of its own rather than a column of tasks: MariaDB adds no column to tasks
-- instantly, nor online (its indexed virtual column `keyed` makes either a rebuild under
-- a shared lock, writes blocked for as long as the table takes to copy).
--
-- Compatible (the line above): a new table that nodes of the version before it ignore.
-- Their pruner does not know it: a row whose task such a node deleted stays (it is
-- read only by its task's id, so it misleads nothing).
CREATE TABLE task_trace_contexts (
  task_id       CHAR(32)     NOT NULL,
  trace_context VARCHAR(568) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT 'W3C traceparent [space tracestate] of the submission',
  PRIMARY KEY (task_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
