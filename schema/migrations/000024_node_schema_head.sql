-- orbit: compatible
-- Each node records the newest schema version its code knows, so that orbit-migrate can
-- tell whether an older node still runs before it applies a step that older nodes could
-- not run against (docs/operations.md, "Upgrades"). NULL: a node older than this column.
--
-- Compatible (the line above): nodes of the version before it run unchanged against it
-- (their registration leaves the column NULL). Instant: no table rebuild.
ALTER TABLE nodes
  ADD COLUMN schema_head INT NULL COMMENT 'newest migration the node''s code knows; NULL: older than 000024' AFTER version,
  ALGORITHM=INSTANT;
