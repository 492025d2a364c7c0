-- What the console shows of every node, not only of the node serving the page.
--
-- A Worker connection's capacity (from its hello), beside what the registry already holds.
ALTER TABLE worker_connections ADD COLUMN capacity INT NULL COMMENT 'the capacity the Worker announced in its hello' AFTER resource_key_support;

-- Claim turns per application and database-clock minute, per node: the fairness history
-- the console draws (claim_turns holds only each node's running totals). Each node adds
-- the turns it granted since its last write to the current minute's row; rows older than
-- an hour are pruned. Operators' view only: nothing reads it to decide anything.
CREATE TABLE claim_turn_minutes (
  application_id CHAR(32)  NOT NULL,
  minute         DATETIME  NOT NULL COMMENT 'database clock, truncated to the minute',
  node_id        CHAR(32)  NOT NULL,
  turns          INT       NOT NULL DEFAULT 0 COMMENT 'claims granted to the application by the node in that minute',
  PRIMARY KEY (application_id, minute, node_id),
  KEY ix_claim_turn_minutes_minute (minute)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
