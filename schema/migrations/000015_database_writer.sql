-- The server of a multi-host ORBIT_MYSQL_DSN (a MariaDB Galera cluster) that every node
-- writes to, recorded in the cluster itself so that all nodes follow one writer: a node
-- that lost its server records the next one; `orbit-admin database writer --host` moves
-- them back (orbit_node/db/hosts.py). NULL: nothing recorded, each node starts at the
-- first server it reaches. A single-host DSN never reads or writes it.
CREATE TABLE database_writer (
  id         TINYINT      NOT NULL COMMENT 'always 1: one row',
  host       VARCHAR(300) NULL COMMENT 'host:port as spelled in ORBIT_MYSQL_DSN',
  changed_by VARCHAR(64)  NOT NULL DEFAULT '' COMMENT 'failover or operator',
  changed_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

INSERT INTO database_writer (id) VALUES (1);
