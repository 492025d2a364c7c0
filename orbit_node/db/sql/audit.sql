-- The audit record of operators' writes (migration 000020): written by the console after
-- each action it takes, read by the console's audit page and `orbit-admin audit list`.

-- name: audit_insert
INSERT INTO audit_records (application_id, namespace_id, credential_id, via, action, queue_id, task_id, filter,
                           changed, outcome)
VALUES (%(application_id)s, %(namespace_id)s, %(credential_id)s, %(via)s, %(action)s, %(queue_id)s, %(task_id)s,
        %(filter)s, %(changed)s, %(outcome)s)

-- Newest first, before %(before)s (an audit id; a page's last). The console reads one
-- namespace, limited to the queues the credential reads: a record of no single queue
-- (NULL) only with every queue. orbit-admin reads an application, a namespace or all of
-- them (each filter NULL when absent), and may name one credential.
-- name: audit_list
SELECT r.audit_id, r.recorded_at, r.credential_id, c.name AS credential_name, r.via, r.action,
       r.queue_id, q.name AS queue, r.task_id, r.filter, r.changed, r.outcome,
       a.name AS application, n.name AS namespace
  FROM audit_records r
  LEFT JOIN credentials c ON c.credential_id = r.credential_id
  LEFT JOIN queues q ON q.queue_id = r.queue_id
  LEFT JOIN namespaces n ON n.namespace_id = r.namespace_id
  LEFT JOIN applications a ON a.application_id = r.application_id
 WHERE r.audit_id < %(before)s
   AND (%(namespace_id)s IS NULL OR r.namespace_id = %(namespace_id)s)
   AND (%(application_id)s IS NULL OR r.application_id = %(application_id)s)
   AND (%(credential_id)s IS NULL OR r.credential_id = %(credential_id)s)
   AND (%(all_queues)s OR r.queue_id IN %(queue_ids)s)
 ORDER BY r.audit_id DESC
 LIMIT %(limit)s
