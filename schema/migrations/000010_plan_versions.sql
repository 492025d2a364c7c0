-- Immutable plan versions: rows are inserted, never updated.
CREATE TABLE plan_versions (
  plan_id    CHAR(32)    NOT NULL,
  version    INT         NOT NULL,
  definition LONGTEXT    NOT NULL COMMENT 'JSON text: {"task": {...}, "schedule": {...}}',
  created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (plan_id, version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
