-- Claim turns per (node, application): the fairness signal of P3 section 3 (how many
-- claims each node's fair pool granted to each application since the node started).
-- Each node writes its own counters about once a second so that operators see every
-- node's rotation from the one database (orbit-admin top). Operators' view only: it
-- decides nothing and nothing reads it to decide anything.
CREATE TABLE claim_turns (
  node_id        CHAR(32)    NOT NULL,
  application_id CHAR(32)    NOT NULL,
  turns          BIGINT      NOT NULL DEFAULT 0 COMMENT 'claims granted to the application by this node since it started',
  updated_at     DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  PRIMARY KEY (node_id, application_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
