-- One row per reservation. outcome stays NULL while the reservation is live.
CREATE TABLE task_attempts (
  attempt_id       BIGINT        NOT NULL AUTO_INCREMENT,
  task_id          CHAR(32)      NOT NULL,
  attempt          INT           NOT NULL COMMENT 'the attempt number this reservation would start',
  fencing_token    VARCHAR(64)   NOT NULL,
  owner_node_id    CHAR(32)      NULL,
  connection_id    VARCHAR(64)   NULL,
  reserved_at      DATETIME(6)   NOT NULL,
  started_at       DATETIME(6)   NULL,
  finished_at      DATETIME(6)   NULL,
  outcome          VARCHAR(32)   NULL COMMENT 'succeeded, failed, retry, reservation_expired, lease_expired, cancelled, expired',
  error            TEXT          NULL,
  PRIMARY KEY (attempt_id),
  UNIQUE KEY uq_attempts_token (task_id, fencing_token)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
