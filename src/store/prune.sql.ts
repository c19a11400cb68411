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
 * One batch: $1 the state, $2 the age in ms (the cutoff is db_now() - $2), $3 the most runs.
 * The runs are locked FOR UPDATE SKIP LOCKED in a materialised CTE (never `id IN (... LIMIT)`,
 * which may touch more rows than the limit): a run another transaction holds (a retry, a
 * cancel) is skipped, not waited for, and its state is checked again under the lock. Their
 * events (no foreign key: deleted here) and the runs go in the same statement; their stages
 * follow through the foreign key's ON DELETE CASCADE and are counted first. The ids are handed
 * on as one array (`= ANY (ARRAY(...))`): an index scan of events (run_id, id) even before the
 * events table has statistics, where a join on the CTE was planned as a sequential scan of all
 * events per batch.
 */
export const PRUNE_BATCH_SQL = `
WITH cutoff AS MATERIALIZED (SELECT ratchet.db_now() - $2::float8 * interval '1 millisecond' AS t),
doomed AS MATERIALIZED (${CANDIDATES}
  ORDER BY r.state, r.created_at
  LIMIT $3
  FOR UPDATE SKIP LOCKED
),
stage_count AS (SELECT count(*)::int AS n FROM ratchet.stages s WHERE s.run_id = ANY (ARRAY(SELECT id FROM doomed))),
gone_events AS (DELETE FROM ratchet.events e WHERE e.run_id = ANY (ARRAY(SELECT id FROM doomed)) RETURNING 1),
gone_runs AS (DELETE FROM ratchet.runs r WHERE r.id = ANY (ARRAY(SELECT id FROM doomed)) RETURNING 1)
SELECT (SELECT count(*)::int FROM gone_runs) AS runs, (SELECT n FROM stage_count) AS stages,
  (SELECT count(*)::int FROM gone_events) AS events`;

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
