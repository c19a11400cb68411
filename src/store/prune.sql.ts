/**
 * Retention: finished runs go with their stages and events, in bounded batches, each batch one
 * short statement (its own transaction), so no lock outlives a batch and work goes on between
 * batches.
 *
 * Which runs: state is one of the finished states (the SQL says so itself, whatever the caller
 * passes) and the run finished before the cutoff by the database clock. `created_at < cutoff`
 * is implied by that (a run is created before it finishes) and lets the existing
 * runs (state, created_at) index range-scan the candidates; `finished_at` (or `updated_at`,
 * never earlier, for a row without it) is then checked on each candidate. Candidates created
 * before the cutoff that finished after it (long runs) are read and skipped, at most once per batch.
 * The oldest go first (index order); no ORDER BY, so no sort of the whole backlog per batch.
 */

const FINISHED = `('succeeded','failed','cancelled','expired')`;

const CANDIDATES = `
  SELECT r.id FROM ratchet.runs r, cutoff c
  WHERE r.state = $1 AND r.state IN ${FINISHED}
    AND r.created_at < c.t AND coalesce(r.finished_at, r.updated_at) < c.t`;

/**
 * One batch: $1 the state, $2 the age in ms (the cutoff is db_now() - $2), $3 the most runs.
 * The runs are locked FOR UPDATE SKIP LOCKED in a materialised CTE (never `id IN (... LIMIT)`,
 * which may touch more rows than the limit): a run another transaction holds (a retry, a
 * cancel) is skipped, not waited for, and its state is checked again under the lock. Their
 * events (no foreign key: deleted here) and the runs go in the same statement; their stages
 * follow through the foreign key's ON DELETE CASCADE and are counted first.
 */
export const PRUNE_BATCH_SQL = `
WITH cutoff AS MATERIALIZED (SELECT ratchet.db_now() - $2::float8 * interval '1 millisecond' AS t),
doomed AS MATERIALIZED (${CANDIDATES}
  LIMIT $3
  FOR UPDATE OF r SKIP LOCKED
),
stage_count AS (SELECT count(*)::int AS n FROM ratchet.stages s WHERE s.run_id IN (SELECT id FROM doomed)),
gone_events AS (DELETE FROM ratchet.events e USING doomed d WHERE e.run_id = d.id RETURNING 1),
gone_runs AS (DELETE FROM ratchet.runs r USING doomed d WHERE r.id = d.id RETURNING 1)
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
