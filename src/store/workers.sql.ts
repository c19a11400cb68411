import { failRunsFrom } from './lease-common.sql.js';

/** Statements about workers and the stages waiting for them (sweeper, registry). */

/** A worker's presence: $1 owner, $2 classes it serves. */
export const UPSERT_WORKER_SQL = `
INSERT INTO ratchet.workers (owner_id, classes, started_at, last_seen_at)
VALUES ($1, $2::text[], ratchet.db_now(), ratchet.db_now())
ON CONFLICT (owner_id) DO UPDATE SET classes = excluded.classes, last_seen_at = excluded.last_seen_at`;

export const DELETE_WORKER_SQL = `DELETE FROM ratchet.workers WHERE owner_id = $1`;

/**
 * What the sweeper re-sends, from PostgreSQL alone, in a bounded batch: due `queued` stages
 * and `running` stages whose lease has expired, of classes $1, at most $2 per branch.
 */
export const SWEEP_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t)
(SELECT s.id::text AS id, s.tool_class, s.attempt + 1 AS next_attempt FROM ratchet.stages s
 WHERE s.state = 'queued' AND s.tool_class = ANY($1::text[]) AND s.available_at <= (SELECT t FROM clk)
 ORDER BY s.tool_class, s.available_at, s.id LIMIT $2)
UNION ALL
(SELECT s.id::text AS id, s.tool_class, s.attempt + 1 AS next_attempt FROM ratchet.stages s
 WHERE s.state = 'running' AND s.tool_class = ANY($1::text[]) AND s.lease_until < (SELECT t FROM clk)
 ORDER BY s.tool_class, s.lease_until, s.id LIMIT $2)`;

/** Milliseconds until stage $1 is due by the database clock (0 when due or no longer queued). */
export const DUE_IN_SQL = `
SELECT coalesce(greatest(0, ceil(extract(epoch FROM (s.available_at - ratchet.db_now())) * 1000))::int, 0) AS wait
FROM ratchet.stages s WHERE s.id = $1::bigint AND s.state = 'queued'`;

/** Classes among $1 that no worker has served within the last $2 ms. */
export const UNSERVED_CLASSES_SQL = `
SELECT c AS tool_class FROM unnest($1::text[]) AS c
WHERE NOT EXISTS (
  SELECT 1 FROM ratchet.workers w WHERE c = ANY(w.classes) AND w.last_seen_at >= ratchet.db_now() - $2::int * interval '1 millisecond'
)`;

/**
 * Opt-in (never the default): fail `queued` stages of classes $1 — classes no worker has
 * served recently — that have been due for longer than $2 ms, with `no_worker`, and their runs.
 */
export const FAIL_UNSERVED_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
gone AS (
  UPDATE ratchet.stages s SET state = 'failed', finished_at = clk.t, updated_at = clk.t,
    error = jsonb_build_object('code', 'no_worker', 'message', 'no worker served tool class ' || s.tool_class || ' for ' || $2::int || ' ms', 'toolClass', s.tool_class)
  FROM clk
  WHERE s.state = 'queued' AND s.tool_class = ANY($1::text[]) AND s.available_at < clk.t - $2::int * interval '1 millisecond'
  RETURNING s.id, s.run_id, s.state, s.error, s.fence, s.attempt
),${failRunsFrom('gone', 'unserved')},
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT g.run_id, g.id, 'stage_failed', g.fence, g.attempt, clk.t, jsonb_build_object('error', g.error) FROM gone g, clk
)
SELECT count(*)::int AS failed FROM gone`;
