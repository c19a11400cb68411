import { DB_NOW_EXPR, BY_ID_RUNNING, failRunsFrom, failedAsValue, settleFrom } from './lease-common.sql.js';

/** Extend (heartbeat), release (graceful shutdown) and the embedded start-up's expiry of dead leases. */
/**
 * Extend (heartbeat) every lease of owner $1 in one statement: $2 stage ids, $3 their fences.
 * A lease is extended only while state = 'running', the owner and the fence match and
 * lease_until > now: an expired lease is never revived, even if nobody reclaimed it yet.
 * An attempt past max_duration_ms (counted from claimed_at) is ended by this same statement
 * with stage_duration_exceeded, a failure counted against the budget, as its retry policy says:
 * $4 holds per lease the delay before the next attempt (the worker's decideRetry), or NULL when the
 * policy allows none (maxElapsed spent). Back to `queued`, due after that delay, while attempts
 * remain; else `failed` with its run (decision attempts_exhausted or max_elapsed in the error and
 * the event). Returns a verdict for every requested lease, with
 * lease_until and the database's now:
 * - extended | duration_exceeded: what this statement did;
 * - run_deadline: the stage was cancelled under this fence because its run expired (deadline.sql.ts);
 * - cancelled: cancelled under this fence (the run was cancelled);
 * - finished: the row moved on under this very fence (succeeded, failed, queued, skipped, or waiting
 *   for its map's items or child run, without a lease): the
 *   attempt's own finish (or release) got there first. Not a lost lease: no heartbeat_lost.
 * - changed: the row held this lease in the statement's snapshot but changed before the
 *   update could take it (a finish, cancel or expiry committing meanwhile): ask again.
 * - lost: expired, taken over (another fence) or gone. Only these write heartbeat_lost.
 */
export const EXTEND_SQL = `
WITH RECURSIVE clk AS MATERIALIZED (SELECT ${DB_NOW_EXPR} AS t),
req AS (SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::int[]) AS r(id, fence, retry_delay_ms)),
cur AS (
  SELECT s.id, s.run_id, s.state, s.fence, s.attempt, s.max_attempts,
    (s.state = 'running' AND s.owner_id = $1 AND s.lease_until > clk.t) AS held,
    (clk.t >= s.claimed_at + s.max_duration_ms * interval '1 millisecond') AS over_duration,
    coalesce(req.retry_delay_ms, 0) AS retry_delay_ms,
    CASE WHEN s.attempt >= s.max_attempts THEN 'attempts_exhausted' WHEN req.retry_delay_ms IS NULL THEN 'max_elapsed' END AS no_retry
  FROM ratchet.stages s JOIN req ON s.id = req.id AND s.fence = req.fence CROSS JOIN clk
  WHERE s.id = ANY($2::bigint[])
),
ok AS (
  UPDATE ratchet.stages s SET lease_until = clk.t + s.lease_ms * interval '1 millisecond', heartbeat_at = clk.t
  FROM cur, clk
  WHERE s.id = ANY($2::bigint[]) AND s.id = cur.id AND cur.held AND NOT cur.over_duration
    AND s.state = ${BY_ID_RUNNING} AND s.owner_id = $1 AND s.fence = cur.fence AND s.lease_until > clk.t
  RETURNING s.id, s.fence, s.lease_until
),
over AS (
  UPDATE ratchet.stages s SET
    state = CASE WHEN cur.no_retry IS NOT NULL THEN 'failed' ELSE 'queued' END,
    available_at = clk.t + cur.retry_delay_ms * interval '1 millisecond',
    finished_at = CASE WHEN cur.no_retry IS NOT NULL THEN clk.t ELSE NULL END,
    error = jsonb_build_object('code', 'stage_duration_exceeded',
      'message', 'attempt ' || s.attempt || ' ran past maxDuration of ' || s.max_duration_ms || ' ms',
      'maxDurationMs', s.max_duration_ms)
      || CASE WHEN cur.no_retry = 'max_elapsed' THEN '{"decision": "max_elapsed"}'::jsonb ELSE '{}'::jsonb END
      -- the last attempt of a stage whose failure is a value (continueOnError; an agent's tool error told to the model)
      || CASE WHEN cur.no_retry IS NOT NULL AND s.continue_on_error THEN '{"asValue": true}'::jsonb ELSE '{}'::jsonb END,
    updated_at = clk.t
  FROM cur, clk
  WHERE s.id = ANY($2::bigint[]) AND s.id = cur.id AND cur.held AND cur.over_duration
    AND s.state = ${BY_ID_RUNNING} AND s.owner_id = $1 AND s.fence = cur.fence AND s.lease_until > clk.t
  RETURNING s.id, s.run_id, s.state, s.error, s.fence, s.attempt, s.continue_on_error, s.next_seqs, s.sink, coalesce(s.step, s.name) AS step,
    s.available_at, cur.retry_delay_ms, cur.no_retry
),
-- The last attempt past maxDuration fails the run, unless the stage's failure is a value: then it counts as done (settleFrom).
over_failed AS (SELECT * FROM over WHERE NOT continue_on_error),${failRunsFrom('over_failed', 'over')},
${failedAsValue('over', 'over_value')},${settleFrom('over_value', 'over_settle')},
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT o.run_id, o.id, 'stage_duration_exceeded', o.fence, o.attempt, clk.t,
    jsonb_build_object('owner', $1::text, 'nextState', o.state)
    || CASE WHEN o.state = 'queued' THEN jsonb_build_object('delayMs', o.retry_delay_ms, 'availableAt', o.available_at)
       ELSE jsonb_build_object('decision', o.no_retry) END
  FROM over o, clk
  UNION ALL
  SELECT x.run_id, x.stage_id, x.type, x.fence, x.attempt, x.at, x.data FROM over_settle_events x
  UNION ALL
  SELECT s.run_id, s.id, 'heartbeat_lost', req.fence, s.attempt, clk.t,
    jsonb_build_object('owner', $1::text, 'currentState', s.state, 'currentFence', s.fence::text, 'leaseUntil', s.lease_until)
  FROM req CROSS JOIN clk
  CROSS JOIN LATERAL (SELECT * FROM ratchet.stages x WHERE x.id = req.id OFFSET 0) s
  WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.id = req.id AND cur.fence = req.fence AND cur.held)
    AND NOT (s.fence = req.fence AND s.state IN ('cancelled', 'succeeded', 'failed', 'queued', 'skipped', 'waiting'))
)
SELECT req.id::text AS id, req.fence::text AS fence,
  CASE WHEN ok.id IS NOT NULL THEN 'extended'
       WHEN over.id IS NOT NULL THEN 'duration_exceeded'
       WHEN cur.held THEN 'changed'
       -- The runs row is read only for a cancelled stage (CASE evaluates lazily).
       WHEN s.state = 'cancelled' AND s.fence = req.fence
         THEN CASE WHEN (SELECT r.state FROM ratchet.runs r WHERE r.id = s.run_id) = 'expired' THEN 'run_deadline' ELSE 'cancelled' END
       WHEN s.fence = req.fence AND s.state IN ('succeeded', 'failed', 'queued', 'skipped', 'waiting') THEN 'finished'
       ELSE 'lost' END AS verdict,
  coalesce(ok.lease_until, s.lease_until) AS lease_until, s.state AS state, clk.t AS db_now
FROM req CROSS JOIN clk
LEFT JOIN ok ON ok.id = req.id AND ok.fence = req.fence
LEFT JOIN over ON over.id = req.id AND over.fence = req.fence
LEFT JOIN cur ON cur.id = req.id AND cur.fence = req.fence
LEFT JOIN LATERAL (SELECT x.state, x.fence, x.lease_until, x.run_id FROM ratchet.stages x WHERE x.id = req.id OFFSET 0) s ON true
ORDER BY req.id`;

/**
 * Release (graceful shutdown): hand leases of owner $1 back at once ($2 ids, $3 fences).
 * The stage is `queued` again, available now; the attempt is not counted against the budget.
 */
export const RELEASE_SQL = `
WITH clk AS MATERIALIZED (SELECT ${DB_NOW_EXPR} AS t),
req AS (SELECT * FROM unnest($2::bigint[], $3::bigint[]) AS r(id, fence)),
rel AS (
  UPDATE ratchet.stages s SET state = 'queued', available_at = clk.t, owner_id = NULL, lease_until = NULL,
    attempt = s.attempt - 1, updated_at = clk.t
  FROM req, clk
  WHERE s.id = ANY($2::bigint[]) AND s.id = req.id AND s.fence = req.fence AND s.owner_id = $1 AND s.state = ${BY_ID_RUNNING} AND s.lease_until > clk.t
  RETURNING s.id, s.run_id, s.fence, s.attempt, s.tool_class
),
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT r.run_id, r.id, 'lease_released', r.fence, r.attempt + 1, clk.t, jsonb_build_object('owner', $1::text) FROM rel r, clk
)
SELECT r.id::text AS id, r.tool_class FROM rel r`;

/**
 * Embedded start-up: only one process can own the data directory, so every lease still held
 * belongs to a dead process. Expire them at once so the next claim reclaims them.
 */
export const EXPIRE_ALL_LEASES_SQL = `
WITH clk AS MATERIALIZED (SELECT ${DB_NOW_EXPR} AS t),
exp AS (
  UPDATE ratchet.stages s SET lease_until = clk.t - interval '1 millisecond', updated_at = clk.t
  FROM clk WHERE s.state = 'running' AND s.lease_until >= clk.t
  RETURNING s.id, s.run_id, s.fence, s.attempt, s.owner_id
),
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT e.run_id, e.id, 'lease_expired_at_startup', e.fence, e.attempt, clk.t, jsonb_build_object('previousOwner', e.owner_id)
  FROM exp e, clk
)
SELECT count(*)::int AS expired FROM exp`;
