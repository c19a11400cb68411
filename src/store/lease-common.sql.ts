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
] as const)
  assertTransition('stage', from, to);
for (const [from, to] of [
  ['queued', 'running'],
  ['queued', 'failed'],
  ['running', 'failed'],
  ['running', 'succeeded'],
  ['running', 'expired'],
  ['running', 'cancelled'],
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
 * stage's error, and its unended stages are cancelled (running parallel ones too: the group failure). Same words everywhere.
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
${prefix}_rest_cancelled AS (
  UPDATE ratchet.stages s SET state = 'cancelled', updated_at = clk.t, finished_at = clk.t
  FROM ${prefix}_run_failed f, clk
  WHERE s.run_id = f.id AND s.state IN (${STAGE_UNENDED})
  RETURNING s.id
),
${prefix}_run_failed_ev AS (
  INSERT INTO ratchet.events (run_id, type, at) SELECT f.id, 'run_failed', clk.t FROM ${prefix}_run_failed f, clk
)`;
}

/** What every claim returns per row (c: the claimed stage, r: its run). */
export const CLAIMED_COLUMNS = `c.id::text AS id, c.run_id, c.seq, c.name, c.tool, c.tool_class, c.state, c.fence::text AS fence,
  c.attempt, c.max_attempts, c.input, c.idempotency_key, c.lease_until, c.lease_ms,
  c.timeout_ms, c.max_duration_ms, c.claimed_at, c.first_claimed_at, c.error, c.prev_state, c.prev_fence::text AS prev_fence, clk.t AS db_now,
  r.workflow, r.definition_hash, r.input AS run_input, r.deadline AS run_deadline, r.traceparent AS run_traceparent`;
