-- Plans and their immutable versions; the trigger that turns fire times into tasks.
-- Due-ness is decided by the database clock (next_fire_at <= NOW(6)); the node only
-- computes fire times from the NOW(6) these statements return.

-- name: plan_insert
INSERT INTO plans (plan_id, namespace_id, application_id, queue_id, name)
VALUES (%(plan_id)s, %(namespace_id)s, %(application_id)s, %(queue_id)s, %(name)s)

-- name: plan_get
SELECT plan_id, namespace_id, application_id, queue_id, name, paused, active_version,
       next_fire_at, last_fire_at, created_at, updated_at
  FROM plans
 WHERE namespace_id = %(namespace_id)s AND plan_id = %(plan_id)s

-- name: plan_by_name
SELECT plan_id
  FROM plans
 WHERE namespace_id = %(namespace_id)s AND name = %(name)s

-- Writers (new version, activate, pause, resume) serialise on the plan row, and the
-- trigger skips a row a writer holds. NOW(6) is the clock next_fire_at is computed from.
-- name: plan_lock
SELECT plan_id, queue_id, paused, active_version, next_fire_at, NOW(6) AS db_now
  FROM plans
 WHERE namespace_id = %(namespace_id)s AND plan_id = %(plan_id)s
 FOR UPDATE

-- name: plan_set_schedule_state
UPDATE plans
   SET paused = %(paused)s, active_version = %(active_version)s, next_fire_at = %(next_fire_at)s
 WHERE plan_id = %(plan_id)s

-- Plans in id order after a cursor; the optional filters are NULL/flags when absent.
-- name: plan_list
SELECT plan_id, namespace_id, application_id, queue_id, name, paused, active_version,
       next_fire_at, last_fire_at, created_at, updated_at
  FROM plans
 WHERE namespace_id = %(namespace_id)s
   AND plan_id > %(after)s
   AND (%(queue_id)s IS NULL OR queue_id = %(queue_id)s)
   AND (%(all_queues)s OR queue_id IN %(queue_ids)s)
 ORDER BY plan_id
 LIMIT %(limit)s

-- name: plan_version_max
SELECT COALESCE(MAX(version), 0) AS version
  FROM plan_versions
 WHERE plan_id = %(plan_id)s

-- Versions are only ever inserted: a change of definition is a new version.
-- name: plan_version_insert
INSERT INTO plan_versions (plan_id, version, definition)
VALUES (%(plan_id)s, %(version)s, %(definition)s)

-- name: plan_version_get
SELECT plan_id, version, definition, created_at
  FROM plan_versions
 WHERE plan_id = %(plan_id)s AND version = %(version)s

-- name: plan_version_list
SELECT plan_id, version, definition, created_at
  FROM plan_versions
 WHERE plan_id = %(plan_id)s AND version > %(after)s
 ORDER BY version
 LIMIT %(limit)s

-- The tasks a plan created, newest first, through ix_tasks_plan (plan_id, task_id).
-- name: plan_task_list
SELECT task_id, queue_id, handler, handler_version, payload_version, state, priority,
       available_at, deadline, attempts, max_attempts, resource_key, cancel_requested,
       created_at, finished_at, retried_from, plan_version
  FROM tasks FORCE INDEX (ix_tasks_plan)
 WHERE plan_id = %(plan_id)s
   AND namespace_id = %(namespace_id)s
   AND task_id < %(before)s
   AND (%(state)s IS NULL OR state = %(state)s)
 ORDER BY task_id DESC
 LIMIT %(limit)s

-- Trigger, step 1 (non-locking): plans due on the database clock, oldest fire time
-- first, through ix_plans_due (paused, next_fire_at).
-- name: plan_due
SELECT plan_id
  FROM plans FORCE INDEX (ix_plans_due)
 WHERE paused = 0 AND next_fire_at <= NOW(6)
 ORDER BY next_fire_at
 LIMIT %(limit)s

-- Trigger, step 2: lock one due plan; a plan another node (or a writer) holds is
-- skipped, never waited for. The condition is checked again on the locked row.
-- name: plan_lock_due
SELECT plan_id, namespace_id, application_id, queue_id, active_version, next_fire_at, last_fire_at,
       NOW(6) AS db_now
  FROM plans
 WHERE plan_id = %(plan_id)s AND paused = 0 AND next_fire_at <= NOW(6)
 FOR UPDATE SKIP LOCKED

-- One fire record per (plan, version, fire time), in the transaction that creates the
-- task: a fire time that already has one creates nothing (0 rows).
-- name: plan_fire_record_insert
INSERT IGNORE INTO idempotency_records (namespace_id, kind, idempotency_key, request_digest, task_id)
VALUES (%(namespace_id)s, 'plan', %(idempotency_key)s, %(request_digest)s, %(task_id)s)

-- name: plan_advance
UPDATE plans
   SET next_fire_at = %(next_fire_at)s, last_fire_at = %(last_fire_at)s
 WHERE plan_id = %(plan_id)s
