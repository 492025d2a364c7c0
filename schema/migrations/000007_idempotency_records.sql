-- Acceptance records. kind 'request' holds client Idempotency-Key values; kind 'plan'
-- holds plan fire records (plan, version, fire time) so the two can never collide.
CREATE TABLE idempotency_records (
  namespace_id    CHAR(32)      NOT NULL,
  kind            VARCHAR(16)   NOT NULL,
  idempotency_key VARCHAR(255)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  request_digest  CHAR(64)      NOT NULL COMMENT 'SHA-256 of the canonical request',
  task_id         CHAR(32)      NOT NULL,
  created_at      DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (namespace_id, kind, idempotency_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
