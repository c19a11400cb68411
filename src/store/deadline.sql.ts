import { closeWaitsOf } from './lease-common.sql.js';
import { assertTransition, sourcesOf, sqlStates } from '../planner/states.js';

/**
 * Run deadlines (DESIGN.md: "past it the run is expired"), enforced from PostgreSQL alone by
 * every worker's sweeper, so a run expires on time even while none of its stages is claimed
 * (a retry delay, a class no worker serves, a stage that runs long). Only the database clock
 * decides. The states come from the state table.
 */
const RUN_EXPIRABLE = sourcesOf('run', 'expired');
const RUN_CANCELLABLE = sourcesOf('run', 'cancelled');
const STAGE_UNFINISHED = sourcesOf('stage', 'cancelled');
for (const from of RUN_EXPIRABLE) assertTransition('run', from, 'expired');
assertTransition('stage', 'waiting', 'queued');
for (const from of STAGE_UNFINISHED) assertTransition('stage', from, 'cancelled');

/**
 * Expire at most $1 runs whose deadline has passed. Each becomes `expired` with the error
 * run_deadline_exceeded, and every stage of it not yet finished becomes `cancelled`, running
 * ones included: the worker holding such a stage learns it at its next extend, which answers
 * `run_deadline` for a stage cancelled under its fence in an expired run, and aborts the
 * attempt with that reason. Events: run_expired, and stage_cancelled with the previous state.
 *
 * Shape: the runs are picked FOR UPDATE SKIP LOCKED in a CTE with its own LIMIT (workers
 * sweeping at once take different runs, a run being finished now is left for the next sweep),
 * joined to the UPDATE. `due` scans runs_active_deadline_idx (migration 0005; its predicate is
 * state IN ('queued','running'), which RUN_EXPIRABLE must match: test/worker/deadline.test.ts
 * checks the plan), so it costs the number of expired runs. An expired child run wakes the
 * stage of its parent that waits for it (waiting -> queued; its next claim fails it with
 * child_run_expired), unless the parent's run expires in this same statement. Returns how many
 * runs expired, their ids (for CANCEL_DESCENDANTS_SQL and CANCEL_LEFTOVERS_SQL), the running
 * stages cancelled, and the parent stages woken (to wake a worker of their class).
 */
export const EXPIRE_RUNS_SQL = expireSql(`
  SELECT r.id FROM ratchet.runs r
  WHERE r.state IN (${sqlStates(RUN_EXPIRABLE)}) AND r.deadline <= (SELECT t FROM clk)
  LIMIT $1
  FOR UPDATE SKIP LOCKED`);

/**
 * The same for run $1 alone, if its deadline has passed: a claim found it so before any sweep
 * (the executor's check), so it waits for the run's row rather than skip it, and then reads it
 * again (an expiry, cancel or failure that committed meanwhile leaves nothing to do).
 */
export const EXPIRE_RUN_SQL = expireSql(`
  SELECT r.id FROM ratchet.runs r
  WHERE r.id = $1::uuid AND r.state IN (${sqlStates(RUN_EXPIRABLE)}) AND r.deadline <= (SELECT t FROM clk)
  FOR UPDATE`);

function expireSql(due: string): string {
  return `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
due AS (${due}
),
run AS (
  UPDATE ratchet.runs r SET state = 'expired', finished_at = clk.t, updated_at = clk.t,
    error = jsonb_build_object('code', 'run_deadline_exceeded', 'message', 'the run''s deadline passed before it ended',
      'deadline', r.deadline)
  FROM due, clk
  WHERE r.id = due.id
  RETURNING r.id, r.parent_stage_id
),
old AS (
  SELECT s.id, s.state FROM ratchet.stages s JOIN run ON s.run_id = run.id WHERE s.state IN (${sqlStates(STAGE_UNFINISHED)})
),
st AS (
  UPDATE ratchet.stages s SET state = 'cancelled', finished_at = clk.t, updated_at = clk.t
  FROM old, clk
  WHERE s.id = old.id AND s.state IN (${sqlStates(STAGE_UNFINISHED)}) -- re-checked if a finish commits meanwhile
  RETURNING s.id, s.run_id, s.fence, s.attempt, old.state AS old_state
),
-- (a parent stage of a run expiring here is cancelled by st instead: one statement never updates a row twice)
parent_woken AS (
  UPDATE ratchet.stages p SET state = 'queued', deps_left = 0, available_at = clk.t, updated_at = clk.t
  FROM run, clk
  WHERE p.id = run.parent_stage_id AND p.state = 'waiting' AND NOT EXISTS (SELECT 1 FROM run x WHERE x.id = p.run_id)
  RETURNING p.id, p.run_id, p.tool_class, p.definition_hash, p.attempt, run.id AS child_run_id
),
-- The open waits of the stages cancelled here (issue 10) end 'expired' in this statement.
waits_closed AS (
  ${closeWaitsOf('(SELECT id FROM st) c', "'expired'")}
),
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT run.id, NULL, 'run_expired', NULL, NULL, clk.t, jsonb_build_object('reason', 'run_deadline') FROM run, clk
  UNION ALL
  SELECT st.run_id, st.id, 'stage_cancelled', st.fence, st.attempt, clk.t,
    jsonb_build_object('previousState', st.old_state, 'reason', 'run_deadline')
  FROM st, clk
  UNION ALL
  SELECT w.run_id, w.stage_id, 'wait_ended', NULL, NULL, clk.t, jsonb_build_object('kind', w.kind, 'outcome', 'expired') FROM waits_closed w, clk
)
SELECT (SELECT count(*) FROM run)::int AS expired, coalesce((SELECT array_agg(run.id::text) FROM run), '{}') AS run_ids,
  coalesce((SELECT array_agg(st.id::text ORDER BY st.id) FROM st WHERE st.old_state = 'running'), '{}') AS running_stage_ids,
  (SELECT coalesce(jsonb_agg(jsonb_build_object('stageId', p.id::text, 'toolClass', p.tool_class, 'definitionHash', p.definition_hash,
     'attempt', p.attempt) ORDER BY p.id), '[]'::jsonb) FROM parent_woken p) AS woken,
  coalesce((SELECT array_agg(kind) FROM waits_closed), '{}') AS waits_closed`;
}

/**
 * The active child runs of runs $1 that are still ended (expired, cancelled or failed: read again,
 * FOR SHARE, so a run retry committing meanwhile, which revives a failed parent and its children,
 * waits or is seen), recursively, cancelled with their unfinished stages, as CANCEL_RUN_SQL cancels a
 * cancelled run's children. Run by cancelDescendants (deadline.ts): right after the statement that
 * ended the runs, in its transaction (the expiry, a cancel) or on its own (a failure's follow-up,
 * leftovers.ts), and by the sweeper for a child left active under an ended parent. In the expiry's
 * transaction it holds a parent's rows while it waits for a child's: when another sweeper expiring
 * that child (waking its parent) or a finish of the child's last stage meets it, PostgreSQL aborts
 * one as a deadlock, and each side asks again (transactionAgain, the finish's retry).
 * A running stage's worker learns it at its next extend (`cancelled`). Events: run_cancelled and
 * stage_cancelled (previous state), reason $2. Returns the runs cancelled and their running stages.
 */
export const CANCEL_DESCENDANTS_SQL = `
WITH RECURSIVE clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
ended AS (SELECT p.id FROM ratchet.runs p WHERE p.id = ANY($1::uuid[]) AND p.state IN ('expired', 'cancelled', 'failed') ORDER BY p.id FOR SHARE),
tree(id) AS (
  SELECT c.id FROM ratchet.runs c JOIN ended ON c.parent_run_id = ended.id
  UNION ALL
  SELECT c.id FROM ratchet.runs c JOIN tree t ON c.parent_run_id = t.id
),
run AS (
  UPDATE ratchet.runs r SET state = 'cancelled', finished_at = clk.t, updated_at = clk.t,
    error = jsonb_build_object('code', 'cancelled', 'message', 'its parent run ended')
  FROM tree, clk WHERE r.id = tree.id AND r.state IN (${sqlStates(RUN_CANCELLABLE)})
  RETURNING r.id
),
old AS (
  SELECT s.id, s.state FROM ratchet.stages s JOIN tree ON s.run_id = tree.id WHERE s.state IN (${sqlStates(STAGE_UNFINISHED)})
),
st AS (
  UPDATE ratchet.stages s SET state = 'cancelled', finished_at = clk.t, updated_at = clk.t
  FROM run, old, clk
  WHERE s.run_id = run.id AND s.id = old.id AND s.state IN (${sqlStates(STAGE_UNFINISHED)})
  RETURNING s.id, s.run_id, s.fence, s.attempt, old.state AS old_state
),
waits_closed AS (
  ${closeWaitsOf('(SELECT id FROM st) c', "'cancelled'")}
),
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT run.id, NULL, 'run_cancelled', NULL, NULL, clk.t, jsonb_build_object('reason', $2::text) FROM run, clk
  UNION ALL
  SELECT st.run_id, st.id, 'stage_cancelled', st.fence, st.attempt, clk.t, jsonb_build_object('previousState', st.old_state, 'reason', $2::text)
  FROM st, clk
  UNION ALL
  SELECT w.run_id, w.stage_id, 'wait_ended', NULL, NULL, clk.t, jsonb_build_object('kind', w.kind, 'outcome', 'cancelled') FROM waits_closed w, clk
)
SELECT coalesce((SELECT array_agg(run.id::text) FROM run), '{}') AS run_ids,
  coalesce((SELECT array_agg(st.id::text ORDER BY st.id) FROM st WHERE st.old_state = 'running'), '{}') AS running_stage_ids,
  coalesce((SELECT array_agg(kind) FROM waits_closed), '{}') AS waits_closed`;

/**
 * The unfinished stages of ended runs $1 (expired or cancelled), cancelled; run right after the
 * statement that ended them, in its transaction (the expiry, a cancel). A finish that inserted an
 * agent's plan while that statement ran committed before it (the statement waited for the finishing
 * stage's row lock), but its new rows were not in the statement's snapshot; this next statement
 * (read committed: a snapshot of its own) sees them. The claims skip such stages in any case
 * (RUN_IS_ACTIVE in claim.sql.ts).
 * Events: stage_cancelled with the previous state and reason $2.
 */
export const CANCEL_LEFTOVERS_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
old AS (
  SELECT s.id, s.state FROM ratchet.stages s JOIN ratchet.runs r ON r.id = s.run_id
  WHERE s.run_id = ANY($1::uuid[]) AND r.state IN ('expired', 'cancelled') AND s.state IN (${sqlStates(STAGE_UNFINISHED)})
),
st AS (
  UPDATE ratchet.stages s SET state = 'cancelled', finished_at = clk.t, updated_at = clk.t
  FROM old, clk
  WHERE s.id = old.id AND s.state IN (${sqlStates(STAGE_UNFINISHED)})
  RETURNING s.id, s.run_id, s.fence, s.attempt, old.state AS old_state
),
waits_closed AS (
  ${closeWaitsOf('(SELECT id FROM st) c', "CASE WHEN $2::text = 'run_deadline' THEN 'expired' ELSE 'cancelled' END")}
),
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT st.run_id, st.id, 'stage_cancelled', st.fence, st.attempt, clk.t,
    jsonb_build_object('previousState', st.old_state, 'reason', $2::text)
  FROM st, clk
  UNION ALL
  SELECT w.run_id, w.stage_id, 'wait_ended', NULL, NULL, clk.t, jsonb_build_object('kind', w.kind, 'outcome', w.outcome) FROM waits_closed w, clk
)
SELECT (SELECT count(*) FROM st)::int AS cancelled`;

/**
 * Ended runs (expired, cancelled, failed) that still have an active child run, at most $1: what a failure's
 * follow-up (cancelFailedLeftovers) left when its process or connection died before it ran. For the sweeper's
 * orphan pass (deadline.ts sweepOrphans). Reads the active runs (runs_state_created_idx), not every child run.
 */
export const ORPHANED_PARENTS_SQL = `
SELECT DISTINCT p.id::text AS id, p.state FROM ratchet.runs c JOIN ratchet.runs p ON p.id = c.parent_run_id
WHERE c.state IN (${sqlStates(RUN_CANCELLABLE)}) AND c.parent_run_id IS NOT NULL AND p.state IN ('expired', 'cancelled', 'failed')
LIMIT $1`;
