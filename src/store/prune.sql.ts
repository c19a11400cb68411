/**
 * Retention: finished runs go with their stages and events, in bounded batches, each batch one
 * short statement (its own transaction), so no lock outlives a batch and work goes on between
 * batches.
 *
 * Which runs: state is one of the finished states (the SQL checks it itself, whatever the caller
 * passes) and the run finished before the cutoff by the database clock. `created_at < cutoff` is
 * implied by that (a run is created before it finishes) and bounds an ordered range scan of the
 * existing runs (state, created_at) index, oldest first, stopping at the batch size; `finished_at`
 * (or `updated_at`, never earlier, for a row without it) is checked on each row read. It is
 * written as the row comparison `(state, created_at) < ($1, cutoff)`: a plain
 * `created_at < cutoff` lets the planner take runs (created_at, id) instead and read every older
 * run of every state (the ones kept for ever included) on each batch. Rows read and skipped: runs
 * of the state created before the cutoff that finished after it (long runs) — at most those, per
 * batch. An index on runs (state, finished_at) would make even those go away.
 */

const FINISHED = `('succeeded','failed','cancelled','expired')`;

const CANDIDATES = `
  SELECT r.id FROM ratchet.runs r
  WHERE $1 IN ${FINISHED} AND r.state = $1
    AND (r.state, r.created_at) < ($1, (SELECT t FROM cutoff)) AND coalesce(r.finished_at, r.updated_at) < (SELECT t FROM cutoff)`;

/**
 * One batch: $1 the state, $2 the age in ms (the cutoff is db_now() - $2), $3 the most runs, $4
 * the most events. The runs are locked FOR UPDATE SKIP LOCKED in a materialised CTE (never
 * `id IN (... LIMIT)`, which may touch more rows than the limit): a run another transaction holds
 * (a retry, a cancel) is skipped, not waited for, and its state is checked again under the lock.
 * Bounded in events too: each locked run's events are counted (at most $4 + 1 read per run), and
 * the runs go, oldest first, while their events add up to at most $4; the others wait for the next
 * batch. A first run with more than $4 events alone loses $4 of them per batch (events have no
 * foreign key) and goes once they fit. Their events and the runs go in the same statement; their
 * stages follow through the foreign key's ON DELETE CASCADE and are counted first. The ids are
 * handed on as arrays (`= ANY (ARRAY(...))`): an index scan of events (run_id, id) even before the
 * events table has statistics. `locked`: runs this batch locked (fewer than $3: none left but
 * those someone else holds); `deferred`: locked runs left for the next batch by the events bound.
 */
export const PRUNE_BATCH_SQL = `
WITH cutoff AS MATERIALIZED (SELECT ratchet.db_now() - $2::float8 * interval '1 millisecond' AS t),
doomed AS MATERIALIZED (${CANDIDATES}
  ORDER BY r.state, r.created_at
  LIMIT $3
  FOR UPDATE SKIP LOCKED
),
sized AS MATERIALIZED (
  SELECT d.id, row_number() OVER (ORDER BY r.created_at, d.id) AS ord,
    (SELECT count(*) FROM (SELECT 1 FROM ratchet.events e WHERE e.run_id = d.id LIMIT $4::int + 1) x) AS n
  FROM doomed d JOIN ratchet.runs r ON r.id = d.id
),
running AS MATERIALIZED (SELECT id, ord, n, sum(n) OVER (ORDER BY ord) AS upto FROM sized),
go AS MATERIALIZED (SELECT id FROM running WHERE upto <= $4::int),
partial AS MATERIALIZED (
  SELECT e.id FROM ratchet.events e
  WHERE e.run_id = (SELECT id FROM running WHERE ord = 1 AND n > $4::int)
  ORDER BY e.run_id, e.id LIMIT $4::int
),
stage_count AS (SELECT count(*)::int AS n FROM ratchet.stages s WHERE s.run_id = ANY (ARRAY(SELECT id FROM go))),
gone_events AS (
  DELETE FROM ratchet.events e WHERE e.run_id = ANY (ARRAY(SELECT id FROM go)) OR e.id = ANY (ARRAY(SELECT id FROM partial))
  RETURNING 1
),
gone_runs AS (DELETE FROM ratchet.runs r WHERE r.id = ANY (ARRAY(SELECT id FROM go)) RETURNING 1)
SELECT (SELECT count(*)::int FROM gone_runs) AS runs, (SELECT n FROM stage_count) AS stages,
  (SELECT count(*)::int FROM gone_events) AS events, (SELECT count(*)::int FROM doomed) AS locked,
  (SELECT count(*)::int FROM doomed) - (SELECT count(*)::int FROM go) AS deferred`;

/**
 * What a prune would delete (--dry-run), without locking or deleting: $1 the state, $2 the age
 * in ms. Counts every matching run (no batch limit) with its stages and events.
 */
export const PRUNE_COUNT_SQL = `
WITH cutoff AS MATERIALIZED (SELECT ratchet.db_now() - $2::float8 * interval '1 millisecond' AS t),
matched AS MATERIALIZED (${CANDIDATES})
SELECT (SELECT count(*)::int FROM matched) AS runs,
  (SELECT count(*)::int FROM ratchet.stages s WHERE s.run_id IN (SELECT id FROM matched)) AS stages,
  (SELECT count(*)::int FROM ratchet.events e WHERE e.run_id IN (SELECT id FROM matched)) AS events`;

/**
 * Schedule ticks (schedules.schema.ts): one batch of at most $2 rows, $1 the latest ticks kept per
 * schedule. A tick goes when (a) its schedule is gone (a delete removes its ticks itself; these are
 * left from before that, or raced it), or (b) it is decided (tick_at <= last_tick_at: no pass and no
 * catch-up ever looks at it again, the schedule row alone says where firing goes on), its run is gone
 * (pruned by retention; or it started none: skipped, or failed and then missed), and it is older
 * than the schedule's latest $1 ticks. A 'failed' tick after last_tick_at (not decided: tried again
 * after the back-off) is never touched. Per schedule: one backward probe of the (schedule, tick_at)
 * key for its cut, then its oldest ticks in key order, so a batch reads the ticks it deletes plus the
 * kept ones older than the cut whose run is still there (runs kept longer than their ticks' turn).
 * Locked rows (a pass writing a tick) are skipped.
 */
export const PRUNE_TICKS_BATCH_SQL = `
WITH cut AS MATERIALIZED (
  SELECT s.name, least(s.last_tick_at, k.t) AS upto
  FROM ratchet.schedules s CROSS JOIN LATERAL (SELECT (SELECT k.tick_at FROM ratchet.schedule_ticks k WHERE k.schedule = s.name
    ORDER BY k.tick_at DESC OFFSET $1::int LIMIT 1) AS t) k
  WHERE k.t IS NOT NULL -- fewer ticks than kept: none goes (least() would skip the null)
),
old AS MATERIALIZED (
  SELECT t.schedule, t.tick_at FROM cut c CROSS JOIN LATERAL (
    SELECT t.schedule, t.tick_at FROM ratchet.schedule_ticks t
    WHERE t.schedule = c.name AND t.tick_at <= c.upto
      AND (t.run_id IS NULL OR NOT EXISTS (SELECT 1 FROM ratchet.runs r WHERE r.id = t.run_id))
    ORDER BY t.tick_at LIMIT $2::int
    FOR UPDATE OF t SKIP LOCKED) t
  LIMIT $2::int
),
orphans AS MATERIALIZED (
  SELECT t.schedule, t.tick_at FROM ratchet.schedule_ticks t
  WHERE NOT EXISTS (SELECT 1 FROM ratchet.schedules s WHERE s.name = t.schedule)
  LIMIT $2::int
  FOR UPDATE OF t SKIP LOCKED
),
doomed AS (SELECT * FROM old UNION ALL SELECT * FROM orphans),
gone AS (
  DELETE FROM ratchet.schedule_ticks t USING doomed d WHERE t.schedule = d.schedule AND t.tick_at = d.tick_at RETURNING 1
)
SELECT (SELECT count(*)::int FROM gone) AS ticks, (SELECT count(*)::int FROM doomed) AS found`;
