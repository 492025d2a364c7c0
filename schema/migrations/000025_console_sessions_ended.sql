-- orbit: compatible
-- Console sessions ended by sign-out, so that a copied cookie of an ended session is
-- refused by every node (docs/operations.md, "Console"). A row may go once its
-- session's cookie has expired anyway (expires_at); sign-outs delete such rows.
--
-- Compatible (the line above): a new table that nodes of the version before it ignore
-- (their cookies carry no session id and are refused by the new nodes: sign in again).
CREATE TABLE console_sessions_ended (
  session_id CHAR(32)    NOT NULL,
  ended_at   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  expires_at DATETIME(6) NOT NULL COMMENT 'the session''s cookie expires then: the row may go',
  PRIMARY KEY (session_id),
  KEY ix_console_sessions_ended_expires (expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
