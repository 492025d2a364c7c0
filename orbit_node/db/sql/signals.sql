-- Signals between nodes (orbit_node.store.signals; table node_signals, migration 000018).

-- name: signal_publish
INSERT INTO node_signals (origin_node_id, kind, queue_id, task_id, due_at) VALUES (%(origin_node_id)s, %(kind)s, %(queue_id)s, %(task_id)s, %(due_at)s)

-- Where a reader starts when its node begins to listen: before the signals of the last
-- %(back_us)s microseconds (written while its Workers' first claims ran), else after the
-- newest signal.
-- name: signal_start
SELECT COALESCE(
         (SELECT MIN(signal_id) - 1 FROM node_signals WHERE created_at >= NOW(6) - INTERVAL %(back_us)s MICROSECOND),
         (SELECT MAX(signal_id) FROM node_signals),
         0) AS start

-- The rows after a reader's cursor and the holes below it it still looks for (ids of
-- inserts not committed when it last read; 0 when none), oldest first: primary-key
-- reads only, and nothing but the read when there is nothing new. A due time is given as the microseconds
-- until it, on the database clock (0 when it has passed), so that the reader sets its
-- own timer without comparing clocks.
-- name: signal_read
SELECT signal_id, origin_node_id, kind, queue_id, task_id,
       CASE WHEN due_at IS NULL THEN NULL
            ELSE GREATEST(0, TIMESTAMPDIFF(MICROSECOND, NOW(6), due_at)) END AS due_in_us
  FROM node_signals
 WHERE signal_id > %(after)s OR signal_id IN %(missing)s
 ORDER BY signal_id
 LIMIT %(limit)s

-- Signals older than %(keep_s)s seconds, a bounded number at a time (every node prunes).
-- name: signal_prune
DELETE FROM node_signals
 WHERE created_at < NOW(6) - INTERVAL %(keep_s)s SECOND
 ORDER BY created_at
 LIMIT %(limit)s
