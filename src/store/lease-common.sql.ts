import { assertTransition, sourcesOf, sqlStates } from '../planner/states.js';

/**
 * Fragments shared by the lease protocol's statements (claim.sql.ts, extend.sql.ts,
 * finish.sql.ts): the transitions they write, checked against the state table when this
 * module loads, and the CTE that ends a run as failed. Only the database clock
 * (ratchet.db_now()) decides expiry. bigint columns are returned as text so both drivers
 * hand back the same decimal strings.
 */
// Every transition written below must be in the state table; checked when this module loads.
for (const [from, to] of [
  ['queued', 'running'],
  ['running', 'running'],
  ['queued', 'failed'],
  ['running', 'failed'],
  ['running', 'queued'],
  ['running', 'succeeded'],
  ['pending', 'queued'],
  ['pending', 'running'],
  ['pending', 'failed'],
  ['pending', 'cancelled'],
  ['queued', 'cancelled'],
  ['waiting', 'cancelled'],
  ['running', 'cancelled'],
  ['waiting', 'queued'],
] as const)
  assertTransition('stage', from, to);
for (const [from, to] of [
  ['queued', 'running'],
  ['queued', 'failed'],
  ['running', 'failed'],
  ['running', 'succeeded'],
  ['running', 'expired'],
  ['running', 'cancelled'],
  ['queued', 'cancelled'],
] as const) {
  assertTransition('run', from, to);
}

export const RUN_ACTIVE = sqlStates(sourcesOf('run', 'failed').filter((s) => sourcesOf('run', 'succeeded').includes(s)));
/** The group failure (run graph): a failed run cancels every unended stage, parallel running ones included (they see `cancelled` at their next extend). */
export const STAGE_UNENDED = sqlStates(
  ['pending', 'queued', 'waiting', 'running'].filter((s) => sourcesOf('stage', 'cancelled').includes(s as 'pending')),
);
export const STAGE_NOT_STARTED = sqlStates(['pending', 'queued'].filter((s) => sourcesOf('stage', 'cancelled').includes(s as 'pending')));

/**
 * CTE fragments that end a run as failed because of stage rows in `source` (a CTE with
 * run_id, state, error columns) whose state is 'failed': the run becomes failed with the
 * stage's error, and its unended stages are cancelled (running parallel ones too: the group failure),
 * with a stage_cancelled event (previous state, reason run_failed) for the running and waiting ones,
 * as the finish writes them; its child runs are cancelled, recursively, with their stages (as the
 * finish's `descendants`). Same words everywhere. The statement must begin WITH RECURSIVE.
 */
export function failRunsFrom(source: string, prefix: string): string {
  return `
${prefix}_run_failed AS (
  UPDATE ratchet.runs r SET state = 'failed', error = src.error, finished_at = clk.t, updated_at = clk.t
  FROM ${source} src, clk
  WHERE r.id = src.run_id AND src.state = 'failed' AND r.state IN (${RUN_ACTIVE})
  RETURNING r.id, r.parent_stage_id
),
-- A child run that failed here wakes its parent's waiting stage (which then fails with child_run_failed).
${prefix}_parent_woken AS (
  UPDATE ratchet.stages p SET state = 'queued', deps_left = 0, available_at = clk.t, updated_at = clk.t
  FROM ${prefix}_run_failed f, clk
  WHERE p.id = f.parent_stage_id AND p.state = 'waiting'
  RETURNING p.id
),
${prefix}_rest_old AS (
  SELECT s.id, s.state FROM ratchet.stages s JOIN ${prefix}_run_failed f ON s.run_id = f.id WHERE s.state IN (${STAGE_UNENDED})
),
-- (the failing stage itself was updated by ${source} in this statement: this UPDATE skips it)
${prefix}_rest_cancelled AS (
  UPDATE ratchet.stages s SET state = 'cancelled', updated_at = clk.t, finished_at = clk.t
  FROM ${prefix}_rest_old o, clk
  WHERE s.id = o.id AND s.state IN (${STAGE_UNENDED})
  RETURNING s.id, s.run_id, s.fence, s.attempt, o.state AS old_state
),
-- The failed run's child runs, recursively, cancelled with their stages.
${prefix}_descendants(id) AS (
  SELECT c.id FROM ratchet.runs c JOIN ${prefix}_run_failed f ON c.parent_run_id = f.id
  UNION ALL
  SELECT c.id FROM ratchet.runs c JOIN ${prefix}_descendants t ON c.parent_run_id = t.id
),
${prefix}_children_cancelled AS (
  UPDATE ratchet.runs r SET state = 'cancelled', finished_at = clk.t, updated_at = clk.t,
    error = jsonb_build_object('code', 'cancelled', 'message', 'its parent run ended')
  FROM ${prefix}_descendants t, clk WHERE r.id = t.id AND r.state IN (${RUN_ACTIVE})
  RETURNING r.id
),
${prefix}_children_stages_cancelled AS (
  UPDATE ratchet.stages s SET state = 'cancelled', finished_at = clk.t, updated_at = clk.t
  FROM ${prefix}_children_cancelled c, clk WHERE s.run_id = c.id AND s.state IN (${STAGE_UNENDED})
  RETURNING s.id
),
${prefix}_run_failed_ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT f.id, NULL, 'run_failed', NULL, NULL, clk.t, NULL FROM ${prefix}_run_failed f, clk
  UNION ALL
  SELECT c.run_id, c.id, 'stage_cancelled', c.fence, c.attempt, clk.t, jsonb_build_object('previousState', c.old_state, 'reason', 'run_failed')
  FROM ${prefix}_rest_cancelled c, clk WHERE c.old_state IN ('running', 'waiting')
  UNION ALL
  SELECT c.id, NULL, 'run_cancelled', NULL, NULL, clk.t, jsonb_build_object('reason', 'parent_ended') FROM ${prefix}_children_cancelled c, clk
)`;
}

/** What every claim returns per row (c: the claimed stage, r: its run). */
export const CLAIMED_COLUMNS = `c.id::text AS id, c.run_id, c.seq, c.name, c.tool, c.tool_class, c.state, c.fence::text AS fence,
  c.attempt, c.max_attempts, c.input, c.idempotency_key, c.lease_until, c.lease_ms,
  c.timeout_ms, c.max_duration_ms, c.claimed_at, c.first_claimed_at, c.error, c.prev_state, c.prev_fence::text AS prev_fence, clk.t AS db_now,
  r.workflow, r.definition_hash, r.input AS run_input, r.deadline AS run_deadline, r.traceparent AS run_traceparent`;
