-- API credentials. The secret is stored only as a SHA-256 digest (secrets are 256-bit
-- random values, so a fast digest is not brute-forceable). scopes is a JSON object:
-- {"tasks:submit": "*"} for all queues of the namespace, or a list of queue ids.
CREATE TABLE credentials (
  credential_id CHAR(32)     NOT NULL,
  namespace_id  CHAR(32)     NOT NULL,
  name          VARCHAR(128) NOT NULL,
  secret_sha256 CHAR(64)     NOT NULL,
  scopes        TEXT         NOT NULL,
  created_at    DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  revoked_at    DATETIME(6)  NULL,
  PRIMARY KEY (credential_id),
  KEY ix_credentials_ns (namespace_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
