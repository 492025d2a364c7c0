-- Limits an operator sets per application so that no tenant can crowd the others out of
-- a node (docs/operations.md, "Limits per application"). NULL: no limit of its own. Both
-- columns are added instantly (no table rebuild); the writers check the values.
ALTER TABLE applications
  ADD COLUMN max_worker_connections INT NULL
    COMMENT 'Worker WebSocket connections of the application one node accepts at most; NULL: its fair share when the node is full' AFTER retain_failed_s,
  ADD COLUMN submits_per_second INT NULL
    COMMENT 'tasks the application may submit per second across the cluster (batch items count one each); NULL: unlimited' AFTER max_worker_connections,
  ADD COLUMN submit_burst INT NULL
    COMMENT 'tasks it may submit at once above that rate (token bucket depth); NULL: one second of the rate' AFTER submits_per_second,
  ALGORITHM=INSTANT;
