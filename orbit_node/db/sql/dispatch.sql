-- Claim, step 1: a non-locking ordered read of candidates through the dispatch index.
-- dispatch_at <= available_at always holds, so "dispatch_at <= NOW(6)" bounds the
-- index range even with millions of future tasks; available_at <= NOW(6) is the real
-- eligibility rule. No row is locked here.
-- name: claim_candidates
SELECT task_id, resource_key, deadline, attempts, max_attempts
  FROM tasks FORCE INDEX (ix_tasks_dispatch)
 WHERE queue_id = %(queue_id)s
   AND state = 'queued'
   AND dispatch_at <= NOW(6)
   AND available_at <= NOW(6)
   AND (handler, handler_version, payload_version) IN %(capabilities)s
   AND (%(resource_keys)s OR resource_key IS NULL)
 ORDER BY dispatch_at, available_at, task_id
 LIMIT %(limit)s
