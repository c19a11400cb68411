import { failRunsFrom, failedAsValue, settleFrom } from './lease-common.sql.js';

/** Statements about workers and the stages waiting for them (sweeper, registry). */

/**
 * A worker's presence: $1 owner, $2 classes it serves, $3 hashes of the definitions it has loaded.
 * Answers `live`: the workers of the database seen within the last $4 ms, this one included
 * (its share of the statement lanes, src/worker/db-lanes.ts).
 */
export const UPSERT_WORKER_SQL = `
INSERT INTO ratchet.workers (owner_id, classes, definitions, started_at, last_seen_at)
VALUES ($1, $2::text[], $3::text[], ratchet.db_now(), ratchet.db_now())
ON CONFLICT (owner_id) DO UPDATE SET classes = excluded.classes, definitions = excluded.definitions, last_seen_at = excluded.last_seen_at
RETURNING 1 + (SELECT count(*) FROM ratchet.workers w
  WHERE w.owner_id <> $1 AND w.last_seen_at > ratchet.db_now() - $4::int * interval '1 millisecond')::int AS live`;

export const DELETE_WORKER_SQL = `DELETE FROM ratchet.workers WHERE owner_id = $1`;

/**
 * What the sweeper re-sends, from PostgreSQL alone, in bounded batches: per lane (tool class
 * $1[i] and definition hash $2[i], the lanes this worker listens on), at most $3 due `queued`
 * stages without a concurrency key (oldest first), $3 with one (in key order: any of them wakes
 * a claim, which then finds the keys with room), and $3 `running` stages whose lease expired.
 * Queued stages count only once they have waited $4 ms in that state (due and unchanged): a
 * stage queued just now had its wake-up sent by whoever queued it (submit, finish, release), and
 * re-sending it too cost a BullMQ job add and a worker's claim for nothing (issue 14's profile:
 * 35% of the fast path's worker CPU). Expired leases have waited their lease already: no grace.
 * And a lane (without concurrency keys) where some stage was claimed within the last $4 ms is
 * being served: its workers claim the oldest due stages on every claim and poll on their own, so
 * its backlog drains without re-sent wake-ups (which, with a backlog older than $4, every worker
 * re-sent every tick: 0.48 wake-ups per stage in the bench). A lane with no claim for $4 ms gets
 * its wake-ups again; nothing waits for good.
 */
export const SWEEP_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t)
SELECT x.id::text AS id, l.c AS tool_class, l.h AS definition_hash, x.next_attempt
FROM unnest($1::text[], $2::text[]) AS l(c, h)
CROSS JOIN LATERAL (
  (SELECT s.id, s.attempt + 1 AS next_attempt FROM ratchet.stages s
   WHERE s.state = 'queued' AND s.concurrency_key IS NULL AND s.tool_class = l.c AND s.definition_hash = l.h
     AND s.available_at <= (SELECT t FROM clk) - $4::int * interval '1 millisecond'
     AND s.updated_at <= (SELECT t FROM clk) - $4::int * interval '1 millisecond'
     AND NOT EXISTS (SELECT 1 FROM ratchet.stages a
       WHERE a.state = 'running' AND a.tool_class = l.c AND a.definition_hash = l.h
         AND a.claimed_at > (SELECT t FROM clk) - $4::int * interval '1 millisecond')
   ORDER BY s.available_at, s.id LIMIT $3)
  UNION ALL
  (SELECT s.id, s.attempt + 1 AS next_attempt FROM ratchet.stages s
   WHERE s.state = 'queued' AND s.concurrency_key IS NOT NULL AND s.tool_class = l.c AND s.definition_hash = l.h
     AND s.available_at <= (SELECT t FROM clk) - $4::int * interval '1 millisecond'
     AND s.updated_at <= (SELECT t FROM clk) - $4::int * interval '1 millisecond'
   LIMIT $3)
  UNION ALL
  (SELECT s.id, s.attempt + 1 AS next_attempt FROM ratchet.stages s
   WHERE s.state = 'running' AND s.tool_class = l.c AND s.definition_hash = l.h AND s.lease_until < (SELECT t FROM clk)
   ORDER BY s.lease_until, s.id LIMIT $3)
) x`;

/**
 * Milliseconds until the first live lease of the lanes ($1[i] class, $2[i] definition hash)
 * expires by the database clock (0 when one has expired already; no row when none is running):
 * the sweeper wakes then to re-send it, instead of at its next tick. Scans
 * stages_running_lease_idx, one row per lane.
 */
export const NEXT_LEASE_EXPIRY_SQL = `
SELECT greatest(0, ceil(extract(epoch FROM (min(x.lease_until) - ratchet.db_now())) * 1000))::int AS wait_ms
FROM unnest($1::text[], $2::text[]) AS l(c, h)
CROSS JOIN LATERAL (
  SELECT s.lease_until FROM ratchet.stages s
  WHERE s.state = 'running' AND s.tool_class = l.c AND s.definition_hash = l.h
  ORDER BY s.lease_until LIMIT 1
) x
HAVING count(*) > 0`;

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
 * served recently — that have been due for longer than $2 ms, with `no_worker`, and their runs
 * (failRunsFrom: siblings and child runs cancelled; a failed child run wakes its parent's waiting
 * stage, which the sweep re-sends). A stage with continue_on_error fails as a value instead and
 * settles (settleFrom): its successors go on, as at a finish.
 */
export const FAIL_UNSERVED_SQL = `
WITH RECURSIVE clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
gone AS (
  UPDATE ratchet.stages s SET state = 'failed', finished_at = clk.t, updated_at = clk.t,
    error = jsonb_build_object('code', 'no_worker', 'message', 'no worker served tool class ' || s.tool_class || ' for ' || $2::int || ' ms', 'toolClass', s.tool_class)
      || CASE WHEN s.continue_on_error THEN '{"asValue": true}'::jsonb ELSE '{}'::jsonb END
  FROM clk
  WHERE s.state = 'queued' AND s.tool_class = ANY($1::text[]) AND s.available_at < clk.t - $2::int * interval '1 millisecond'
  RETURNING s.id, s.run_id, s.state, s.error, s.fence, s.attempt, s.continue_on_error, s.next_seqs, s.sink, coalesce(s.step, s.name) AS step
),
gone_failed AS (SELECT * FROM gone WHERE NOT continue_on_error),${failRunsFrom('gone_failed', 'unserved')},
${failedAsValue('gone', 'gone_value')},${settleFrom('gone_value', 'unserved_settle')},
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT g.run_id, g.id, 'stage_failed', g.fence, g.attempt, clk.t, jsonb_build_object('error', g.error)
    || CASE WHEN g.continue_on_error THEN '{"asValue": true}'::jsonb ELSE '{}'::jsonb END FROM gone g, clk
  UNION ALL
  SELECT x.run_id, x.stage_id, x.type, x.fence, x.attempt, x.at, x.data FROM unserved_settle_events x
)
SELECT count(*)::int AS failed, coalesce(array_agg(id::text) FILTER (WHERE NOT continue_on_error), '{}') AS failed_ids FROM gone`;
