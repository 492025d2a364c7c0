-- Plans: scheduled task sources in a queue. active_version points at an immutable version.
CREATE TABLE plans (
  plan_id        CHAR(32)     NOT NULL,
  namespace_id   CHAR(32)     NOT NULL,
  application_id CHAR(32)     NOT NULL,
  queue_id       CHAR(32)     NOT NULL,
  name           VARCHAR(128) NOT NULL,
  paused         TINYINT(1)   NOT NULL DEFAULT 0,
  active_version INT          NULL,
  next_fire_at   DATETIME(6)  NULL COMMENT 'next fire time of the active version, database clock',
  last_fire_at   DATETIME(6)  NULL,
  created_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  PRIMARY KEY (plan_id),
  UNIQUE KEY uq_plans_ns_name (namespace_id, name),
  KEY ix_plans_due (paused, next_fire_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
