import { assertTransition, sourcesOf, sqlStates } from '../planner/states.js';

/**
 * Run deadlines (DESIGN.md: "past it the run is expired"), enforced from PostgreSQL alone by
 * every worker's sweeper, so a run expires on time even while none of its stages is claimed
 * (a retry delay, a class no worker serves, a stage that runs long). Only the database clock
 * decides. The states come from the state table.
 */
const RUN_EXPIRABLE = sourcesOf('run', 'expired');
const STAGE_UNFINISHED = sourcesOf('stage', 'cancelled');
for (const from of RUN_EXPIRABLE) assertTransition('run', from, 'expired');
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
 * checks the plan), so it costs the number of expired runs. Returns how many runs expired,
 * their ids (for CANCEL_LEFTOVERS_SQL) and the running stages cancelled.
 */
export const EXPIRE_RUNS_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
due AS (
  SELECT r.id FROM ratchet.runs r
  WHERE r.state IN (${sqlStates(RUN_EXPIRABLE)}) AND r.deadline <= (SELECT t FROM clk)
  LIMIT $1
  FOR UPDATE SKIP LOCKED
),
run AS (
  UPDATE ratchet.runs r SET state = 'expired', finished_at = clk.t, updated_at = clk.t,
    error = jsonb_build_object('code', 'run_deadline_exceeded', 'message', 'the run''s deadline passed before it ended',
      'deadline', r.deadline)
  FROM due, clk
  WHERE r.id = due.id
  RETURNING r.id
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
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT run.id, NULL, 'run_expired', NULL, NULL, clk.t, jsonb_build_object('reason', 'run_deadline') FROM run, clk
  UNION ALL
  SELECT st.run_id, st.id, 'stage_cancelled', st.fence, st.attempt, clk.t,
    jsonb_build_object('previousState', st.old_state, 'reason', 'run_deadline')
  FROM st, clk
)
SELECT (SELECT count(*) FROM run)::int AS expired, coalesce((SELECT array_agg(run.id::text) FROM run), '{}') AS run_ids,
  coalesce((SELECT array_agg(st.id::text ORDER BY st.id) FROM st WHERE st.old_state = 'running'), '{}') AS running_stage_ids`;

/**
 * The unfinished stages of ended runs $1 (expired or cancelled), cancelled; run right after the
 * statement that ended them. A finish that inserted an agent's plan while that statement ran
 * committed before it (the statement waited for the finishing stage's row lock), but its new
 * rows were not in the statement's snapshot; this next statement sees them. Until it runs (a
 * process that dies in between) the claims skip such stages (RUN_IS_ACTIVE in claim.sql.ts).
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
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT st.run_id, st.id, 'stage_cancelled', st.fence, st.attempt, clk.t,
    jsonb_build_object('previousState', st.old_state, 'reason', $2::text)
  FROM st, clk
)
SELECT (SELECT count(*) FROM st)::int AS cancelled`;
