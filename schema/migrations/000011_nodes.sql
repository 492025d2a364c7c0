-- Node registry and the Worker connections each node serves (for explanations and operators).
CREATE TABLE nodes (
  node_id      CHAR(32)     NOT NULL,
  hostname     VARCHAR(255) NOT NULL,
  http_addr    VARCHAR(255) NOT NULL,
  version      VARCHAR(64)  NOT NULL,
  started_at   DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  heartbeat_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  stopped_at   DATETIME(6)  NULL,
  PRIMARY KEY (node_id),
  KEY ix_nodes_heartbeat (heartbeat_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE worker_connections (
  connection_id        VARCHAR(64)  NOT NULL,
  node_id              CHAR(32)     NOT NULL,
  namespace_id         CHAR(32)     NOT NULL,
  queues               TEXT         NOT NULL COMMENT 'JSON list of queue ids',
  capabilities         TEXT         NOT NULL COMMENT 'JSON list of [handler, handler_version, payload_version]',
  resource_key_support TINYINT(1)   NOT NULL DEFAULT 0,
  client_name          VARCHAR(128) NULL,
  client_version       VARCHAR(64)  NULL,
  connected_at         DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  heartbeat_at         DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (connection_id),
  KEY ix_worker_connections_ns (namespace_id),
  KEY ix_worker_connections_node (node_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
