-- Queues and their controls. application_id is copied from the namespace at creation
-- (namespace ownership never changes) so claims need no join to find their fairness group.
CREATE TABLE queues (
  queue_id              CHAR(32)     NOT NULL COMMENT '32 lowercase hex characters',
  namespace_id          CHAR(32)     NOT NULL,
  application_id        CHAR(32)     NOT NULL,
  name                  VARCHAR(128) NOT NULL,
  paused                TINYINT(1)   NOT NULL DEFAULT 0 COMMENT 'gate: a paused queue gets no new reservations',
  max_concurrency       INT          NULL COMMENT 'reserved + running tasks of this queue across all nodes; NULL = unlimited',
  max_starts_per_second INT          NULL COMMENT 'reservations per database-clock second; NULL = unlimited',
  start_window_s        BIGINT       NOT NULL DEFAULT 0,
  start_window_count    INT          NOT NULL DEFAULT 0,
  created_at            DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at            DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  PRIMARY KEY (queue_id),
  UNIQUE KEY uq_queues_ns_name (namespace_id, name),
  KEY ix_queues_app (application_id),
  CONSTRAINT ck_queues_concurrency CHECK (max_concurrency IS NULL OR max_concurrency >= 0),
  CONSTRAINT ck_queues_rate CHECK (max_starts_per_second IS NULL OR max_starts_per_second >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
