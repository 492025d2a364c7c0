-- Applications: the unit of fairness and quota. Owns namespaces.
CREATE TABLE applications (
  application_id            CHAR(32)     NOT NULL COMMENT '32 lowercase hex characters',
  name                      VARCHAR(128) NOT NULL,
  suspended                 TINYINT(1)   NOT NULL DEFAULT 0 COMMENT 'gate: a suspended application gets no new reservations',
  max_concurrent_executions INT          NULL COMMENT 'quota: reserved + running tasks across all nodes; NULL = unlimited',
  max_starts_per_second     INT          NULL COMMENT 'start quota: reservations per database-clock second; NULL = unlimited',
  start_window_s            BIGINT       NOT NULL DEFAULT 0 COMMENT 'database-clock second the start counter belongs to',
  start_window_count        INT          NOT NULL DEFAULT 0,
  created_at                DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at                DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  PRIMARY KEY (application_id),
  UNIQUE KEY uq_applications_name (name),
  CONSTRAINT ck_applications_quota CHECK (max_concurrent_executions IS NULL OR max_concurrent_executions >= 0),
  CONSTRAINT ck_applications_rate CHECK (max_starts_per_second IS NULL OR max_starts_per_second >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
