-- Fairness weight of an application: with every application asking, each node's claim
-- turns are shared in proportion to the weights (docs/scheduling.md, "Weights"). Every
-- existing application gets 1, and weight 1 everywhere is P3's rotation, so nothing
-- changes until an operator sets one (orbit-admin application weight APPLICATION N).
-- Nodes read the weights other than 1 about once a second (ix_applications_weight).
ALTER TABLE applications
  ADD COLUMN fairness_weight SMALLINT NOT NULL DEFAULT 1
    COMMENT 'share of claim turns relative to other applications, 1-100; 1 = P3 rotation' AFTER max_starts_per_second,
  ADD CONSTRAINT ck_applications_weight CHECK (fairness_weight BETWEEN 1 AND 100);

CREATE INDEX ix_applications_weight ON applications (fairness_weight);
