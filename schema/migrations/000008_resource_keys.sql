-- Resource-key occupancy: one row per (namespace, resource_key), created when the
-- first task naming it is accepted. holder_task_id is the reserved/running task that
-- occupies the key, NULL when free. Claims lock these rows with SKIP LOCKED and never wait.
CREATE TABLE resource_keys (
  namespace_id   CHAR(32)     NOT NULL,
  resource_key   VARCHAR(255) NOT NULL,
  holder_task_id CHAR(32)     NULL,
  updated_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
  PRIMARY KEY (namespace_id, resource_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
