-- Namespaces: owned by exactly one application (a server-side fact a client cannot change).
CREATE TABLE namespaces (
  namespace_id   CHAR(32)     NOT NULL,
  application_id CHAR(32)     NOT NULL,
  name           VARCHAR(128) NOT NULL,
  environment    VARCHAR(64)  NOT NULL COMMENT 'label such as test or prod',
  created_at     DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (namespace_id),
  UNIQUE KEY uq_namespaces_app_name (application_id, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
