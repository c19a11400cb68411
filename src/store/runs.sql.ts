import { closeWaitsOf, RUN_ACTIVE } from './lease-common.sql.js';
/** Statements for submitting and reading runs. Parameters are listed above each. */

/**
 * Insert a run; $1 id, $2 workflow, $3 definition hash, $4 input, $5 an absolute deadline, or
 * NULL, $6 submit idempotency key, $7 request hash, $8 a deadline as ms from the database's
 * now, or NULL (only the database clock decides a relative deadline, never the submitter's).
 * A repeated key inserts nothing and returns no row. $9 priority, $10 traceparent or NULL, $11 sinks left (NULL: the run ends explicitly).
 */
export const INSERT_RUN_SQL = `
INSERT INTO ratchet.runs (id, workflow, definition_hash, input, state, deadline, idempotency_key, request_hash, created_at, updated_at, priority,
  traceparent, sinks_left)
VALUES ($1, $2, $3, $4::jsonb, 'queued', coalesce($5::timestamptz, ratchet.db_now() + $8::int * interval '1 millisecond'), $6, $7,
  ratchet.db_now(), ratchet.db_now(), $9::int, $10, $11::int)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, state`;

/**
 * Insert a run's planned stages from $2 (a JSON array) for run $1 (inserted just before, in the
 * same transaction; each stage copies its definition hash for the claim). The first stage is
 * `queued` with its input; the rest are `pending` until the stage before them finishes.
 */
export const INSERT_STAGES_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
ins AS (
  INSERT INTO ratchet.stages (run_id, definition_hash, seq, name, step, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms,
    max_attempts, idempotency_key, concurrency_key, concurrency_limit, input, deps, next_seqs, deps_left, continue_on_error, sink,
    available_at, created_at, updated_at, priority)
  SELECT $1::uuid, r.definition_hash, p.seq, p.name, p.step, p.tool, p."toolClass", p.state,
    p."leaseMs", p."timeoutMs", p."maxDurationMs", p."maxAttempts", p."idempotencyKey", p."concurrencyKey", p."concurrencyLimit", p.input,
    p.deps, p."nextSeqs", p."depsLeft", p."continueOnError", p.sink, clk.t, clk.t, clk.t, r.priority
  FROM jsonb_to_recordset($2::jsonb) AS p(seq int, name text, step text, tool text, "toolClass" text, state text, "leaseMs" int,
    "timeoutMs" int, "maxDurationMs" int, "maxAttempts" int, "idempotencyKey" text, "concurrencyKey" text,
    "concurrencyLimit" int, input jsonb, deps int[], "nextSeqs" int[], "depsLeft" int, "continueOnError" boolean, sink text), clk, (SELECT definition_hash, priority FROM ratchet.runs WHERE id = $1::uuid) r
  RETURNING id, seq, state, tool_class
),
ev AS (
  INSERT INTO ratchet.events (run_id, type, at, data)
  SELECT $1::uuid, 'run_submitted', clk.t, jsonb_build_object('stages', (SELECT count(*) FROM ins)) FROM clk
)
SELECT id::text AS id, seq, state, tool_class FROM ins ORDER BY seq`;

export const GET_RUN_BY_KEY_SQL = `SELECT id, state, request_hash FROM ratchet.runs WHERE idempotency_key = $1`;

export const GET_RUN_SQL = `
SELECT r.id, r.workflow, r.definition_hash, r.input, r.state, r.deadline, r.idempotency_key, r.result, r.error, r.priority,
  r.traceparent, r.created_at, r.updated_at, r.finished_at, r.parent_run_id, r.parent_stage_id::text AS parent_stage_id, ratchet.db_now() AS db_now
FROM ratchet.runs r WHERE r.id = $1`;

/** The child runs of run $1 (runs_parent_idx), oldest first. */
export const GET_CHILDREN_SQL = `
SELECT r.id, r.workflow, r.state, r.parent_stage_id::text AS parent_stage_id, r.created_at, r.finished_at
FROM ratchet.runs r WHERE r.parent_run_id = $1::uuid ORDER BY r.created_at, r.id`;

/** The child run a stage started ($1: the parent stage's id), if any (runs_parent_stage_uq). */
export const GET_CHILD_RUN_SQL = `
SELECT r.id, r.state, r.result, r.error FROM ratchet.runs r WHERE r.parent_stage_id = $1::bigint`;

export const GET_STAGES_SQL = `
SELECT s.id::text AS id, s.seq, s.name, s.tool, s.tool_class, s.state, s.owner_id, s.fence::text AS fence, s.attempt,
  s.max_attempts, s.lease_until, s.heartbeat_at, s.claimed_at, s.available_at, s.idempotency_key, s.effect_key,
  s.input, s.result, s.error, s.created_at, s.updated_at, s.finished_at, s.deps, s.item_index, s.group_seq
FROM ratchet.stages s WHERE s.run_id = $1 ORDER BY s.seq`;

export const LIST_EVENTS_SQL = `
SELECT e.id::text AS id, e.run_id, e.stage_id::text AS stage_id, e.type, e.fence::text AS fence, e.attempt, e.at, e.data
FROM ratchet.events e WHERE e.run_id = $1 AND e.id > $2::bigint ORDER BY e.id LIMIT $3`;

/**
 * Move one stage to $2 if its current state is one of $3 (the sources of $2 in the state
 * table). Returns the row when it moved; the caller tells "illegal" from "unknown" apart.
 */
export const TRANSITION_STAGE_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
cur AS (SELECT id, state FROM ratchet.stages WHERE id = $1::bigint),
moved AS (
  UPDATE ratchet.stages s SET state = $2, updated_at = clk.t,
    available_at = CASE WHEN $2 = 'queued' THEN clk.t ELSE s.available_at END,
    finished_at = CASE WHEN $2 IN ('succeeded','failed','cancelled') THEN clk.t ELSE NULL END
  FROM clk WHERE s.id = $1::bigint AND s.state = ANY($3::text[])
  RETURNING s.id
)
SELECT (SELECT state FROM cur) AS previous_state, (SELECT count(*) FROM moved)::int AS moved`;

export const SET_CLOCK_OFFSET_SQL = `UPDATE ratchet.clock SET offset_ms = $1 WHERE id = 1 RETURNING offset_ms`;
export const GET_CLOCK_SQL = `SELECT ratchet.db_now() AS now, (SELECT offset_ms FROM ratchet.clock WHERE id = 1) AS offset_ms`;

/**
 * Cancel run $1: the run becomes `cancelled` and every stage not yet finished too (pending,
 * queued, and running: a running stage's worker sees `cancelled` at its next heartbeat and
 * aborts). Returns the previous run state and the stages that were running (their request
 * may already have been sent: it cannot be recalled).
 */
export const CANCEL_RUN_SQL = `
WITH RECURSIVE clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
prev AS (SELECT id, state FROM ratchet.runs WHERE id = $1::uuid),
-- The run and, when it changes, its child runs recursively (cancelling a parent cancels its children).
tree(id) AS (
  SELECT id FROM ratchet.runs WHERE id = $1::uuid AND state = ANY($2::text[])
  UNION ALL
  SELECT c.id FROM ratchet.runs c JOIN tree t ON c.parent_run_id = t.id
),
run AS (
  UPDATE ratchet.runs r SET state = 'cancelled', finished_at = clk.t, updated_at = clk.t,
    error = CASE WHEN r.id = $1::uuid THEN jsonb_build_object('code', 'cancelled', 'message', 'the run was cancelled')
      ELSE jsonb_build_object('code', 'cancelled', 'message', 'its parent run was cancelled') END
  FROM tree, clk WHERE r.id = tree.id AND r.state = ANY($2::text[])
  RETURNING r.id, r.parent_stage_id
),
st AS (
  UPDATE ratchet.stages s SET state = 'cancelled', finished_at = clk.t, updated_at = clk.t
  FROM run, clk, (SELECT x.id, x.state AS old_state FROM ratchet.stages x JOIN tree ON x.run_id = tree.id) o
  WHERE s.run_id = run.id AND o.id = s.id AND s.state = ANY($3::text[])
  RETURNING s.id, s.run_id, s.fence, s.attempt, o.old_state
),
-- A child run cancelled on its own wakes its parent's stage, which then fails with child_run_cancelled.
parent_woken AS (
  UPDATE ratchet.stages p SET state = 'queued', deps_left = 0, available_at = clk.t, updated_at = clk.t
  FROM run, clk WHERE run.id = $1::uuid AND p.id = run.parent_stage_id AND p.state = 'waiting'
  RETURNING p.id
),
-- The open waits of the stages cancelled here (a sleep, a signal, an approval: issue 10) end 'cancelled'
-- in this statement: an approval without a timeout would otherwise stay open for good.
waits_closed AS (
  ${closeWaitsOf('(SELECT id FROM st) c', "'cancelled'")}
),
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT run.id, NULL, 'run_cancelled', NULL, NULL, clk.t, CASE WHEN run.id <> $1::uuid THEN jsonb_build_object('reason', 'parent_cancelled') END
  FROM run, clk
  UNION ALL
  SELECT st.run_id, st.id, 'stage_cancelled', st.fence, st.attempt, clk.t, jsonb_build_object('previousState', st.old_state) FROM st, clk
  UNION ALL
  SELECT w.run_id, w.stage_id, 'wait_ended', NULL, NULL, clk.t, jsonb_build_object('kind', w.kind, 'outcome', 'cancelled') FROM waits_closed w, clk
)
SELECT (SELECT state FROM prev) AS previous_state, (SELECT count(*) FROM run WHERE id = $1::uuid)::int AS cancelled,
  coalesce((SELECT array_agg(id::text) FROM run), '{}') AS run_ids,
  coalesce((SELECT array_agg(id::text) FROM st WHERE old_state = 'running'), '{}') AS running_stage_ids,
  coalesce((SELECT array_agg(kind) FROM waits_closed), '{}') AS waits_closed`;

/**
 * Retry failed run $1 from its failed stages, as one conditional statement. Every way a run
 * fails leaves a failed stage to start from: a tool's permanent error or spent budget
 * (attempts, maxElapsed, maxDuration), a failed model call or a refused action list (the model
 * stage), a next step whose input() threw (that step, never the one before it), a changed
 * definition, no worker. Only `failed` runs are retried: an expired or cancelled run is
 * resubmitted as a new run, and so is a failed run whose deadline has passed. The run goes
 * failed -> running (error cleared, kept in the event), its failed stages failed -> queued (every
 * one, not only the first by seq, the one reported: one statement can fail several, a finish batch,
 * a claim of expired leases with their attempts spent, failUnserved, and a join waiting for two of
 * them would wait for good) with a fresh attempt budget (attempt back to 0, maxElapsed counted again from the next claim; the
 * fencing token still grows, from the one sequence), and the later stages the failure cancelled
 * cancelled -> pending. Nothing moves unless the run is `failed`, has a failed stage and its
 * deadline (if any) has not passed. The history stays: every earlier event is kept and a
 * `run_retried` event records the attempts used and the error retried from.
 * A child run whose parent ended is retried with its parent (retryRun's reattach), never alone
 * (parent_ended): it would run under an ended parent, and the sweeper's orphan pass would cancel it.
 * Nor one whose parent stage took its end or is taking it (parent_ended too): its result would go nowhere.
 * A parent stage queued to take the child's end waits for the retried child again.
 * Returns the previous run state, why nothing moved when it did not, and the stages it queued (to wake).
 */
export const RETRY_RUN_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
prev AS (SELECT id, state, deadline, error, parent_run_id, parent_stage_id FROM ratchet.runs WHERE id = $1::uuid),
-- A child run is retried alone only while its parent stage has not yet taken its end: the parent active, the stage
-- still waiting for it, or queued to take it (the child's end woke it) and not yet claimed. The stage's row is locked
-- (a claim skips it meanwhile, or has it already: running, refused) and a queued one waits for the child again
-- (parent_rewait). A parent that ended, or a stage that took the child's end or is taking it (running: its finish
-- would carry the old end), would leave the retried child's result going nowhere.
parent_stage AS (
  SELECT ps.id, ps.state FROM prev JOIN ratchet.stages ps ON ps.id = prev.parent_stage_id FOR UPDATE OF ps
),
parent_ended AS (
  SELECT EXISTS (
    SELECT 1 FROM prev JOIN ratchet.runs p ON p.id = prev.parent_run_id
    WHERE p.state NOT IN (${RUN_ACTIVE}) OR NOT EXISTS (SELECT 1 FROM parent_stage ps WHERE ps.state IN ('waiting', 'queued'))
  ) AS yes
),
failed_stage AS (
  SELECT s.id, s.seq, s.name, s.tool, s.tool_class, s.attempt, s.max_attempts, s.fence, s.error
  FROM ratchet.stages s WHERE s.run_id = $1::uuid AND s.state = 'failed' AND NOT coalesce((s.error ->> 'asValue')::boolean, false)
  ORDER BY s.seq LIMIT 1
),
run AS (
  UPDATE ratchet.runs r SET state = 'running', error = NULL, finished_at = NULL, updated_at = clk.t,
    -- a run with several sinks keeps the part of its result its ended sinks wrote
    result = CASE WHEN r.sinks_left IS NULL THEN NULL ELSE r.result END
  FROM clk, failed_stage f
  WHERE r.id = $1::uuid AND r.state = 'failed' AND (r.deadline IS NULL OR r.deadline > clk.t) AND NOT (SELECT yes FROM parent_ended)
  RETURNING r.id
),
st AS (
  UPDATE ratchet.stages s SET state = 'queued', attempt = 0, owner_id = NULL, lease_until = NULL, heartbeat_at = NULL,
    claimed_at = NULL, first_claimed_at = NULL, available_at = clk.t, finished_at = NULL, updated_at = clk.t
  FROM run, clk
  WHERE s.run_id = run.id AND s.state = 'failed' AND NOT coalesce((s.error ->> 'asValue')::boolean, false)
  RETURNING s.id, s.seq, s.tool_class
),
-- The stages the failure cancelled: pending again while they wait for something (their join counter
-- kept what had ended), queued when they were already due (a parallel branch cancelled while queued or running).
later AS (
  UPDATE ratchet.stages s SET state = CASE WHEN s.deps_left > 0 THEN 'pending' ELSE 'queued' END, attempt = 0, owner_id = NULL,
    lease_until = NULL, heartbeat_at = NULL, claimed_at = NULL, first_claimed_at = NULL, available_at = clk.t, finished_at = NULL, updated_at = clk.t
  FROM run, failed_stage f, clk
  WHERE s.run_id = run.id AND s.state = 'cancelled'
  RETURNING s.id, s.tool_class, s.state
),
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT $1::uuid, f.id, 'run_retried', f.fence, f.attempt, clk.t,
    jsonb_build_object('seq', f.seq, 'attemptsUsed', f.attempt, 'maxAttempts', f.max_attempts,
      'previousError', (SELECT error FROM prev), 'stagesReplanned', (SELECT count(*) FROM later), 'stagesRetried', (SELECT count(*) FROM st),
      'retriedStageIds', (SELECT jsonb_agg(id::text ORDER BY seq) FROM st))
  FROM run, failed_stage f, clk
),
-- The parent stage the child's end had queued waits for the retried child again (its end queues it once more).
parent_rewait AS (
  UPDATE ratchet.stages ps SET state = 'waiting', deps_left = 1, updated_at = clk.t
  FROM run, parent_stage p, clk WHERE ps.id = p.id AND p.state = 'queued'
  RETURNING ps.id, ps.run_id
),
rewait_ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, at, data)
  SELECT w.run_id, w.id, 'stage_waiting', clk.t, jsonb_build_object('reason', 'child_retried', 'childRunId', $1::text) FROM parent_rewait w, clk
),
-- A retried stage's call was approved (it then failed for good): its next claim runs it with the approved
-- input without asking again (decideGate, a documented choice); say so, with who approved and when.
reused AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, at, data)
  SELECT $1::uuid, st.id, 'approval_reused', clk.t,
    jsonb_build_object('decidedBy', w.decided_by, 'actor', w.actor, 'decidedAt', w.ended_at, 'inputHash', w.input_hash)
  FROM st, clk, ratchet.waits w
  WHERE w.stage_id = st.id AND w.kind = 'approval' AND w.outcome = 'approved'
)
SELECT (SELECT state FROM prev) AS previous_state, (SELECT count(*) FROM run)::int AS retried,
  (SELECT deadline IS NOT NULL AND deadline <= clk.t FROM prev) AS deadline_passed,
  f.id::text AS stage_id, f.seq, f.name, f.tool, f.tool_class, f.attempt AS attempts_used, f.error AS stage_error,
  (SELECT coalesce(jsonb_agg(jsonb_build_object('stageId', q.id::text, 'toolClass', q.tool_class) ORDER BY q.id), '[]'::jsonb)
   FROM (SELECT id, tool_class FROM st UNION ALL SELECT id, tool_class FROM later WHERE state = 'queued') q) AS queued,
  coalesce((SELECT array_agg(id::text ORDER BY seq) FROM st), '{}') AS retried_stage_ids,
  (SELECT yes FROM parent_ended) AS parent_ended
FROM clk LEFT JOIN failed_stage f ON true`;

/**
 * The child-run stages of run $1 that its retry just revived (queued or pending again) while their
 * child run did not succeed: the child's id, state, definition and whether its parent's end
 * cancelled it (failRunsFrom's and the finish's cascade write that message; CANCEL_RUN_SQL writes
 * none). Through runs_parent_stage_uq.
 */
export const REVIVED_CHILD_STAGES_SQL = `
SELECT s.id::text AS stage_id, c.id AS child_id, c.state AS child_state, c.definition_hash AS child_definition_hash,
  (c.state = 'cancelled' AND c.error ->> 'message' = 'its parent run ended') AS parent_ended
FROM ratchet.stages s JOIN ratchet.runs c ON c.parent_stage_id = s.id
WHERE s.run_id = $1::uuid AND s.state IN ('queued', 'pending') AND c.state IN ('failed', 'cancelled', 'expired')
ORDER BY s.seq`;

/**
 * A revived child-run stage ($1) goes to $2: `waiting` for its child run retried with it (the
 * child's end queues it: parent_woken), or `queued` (due now: a new child, or the child's end told
 * again). Its join counter only ever counted that wait (its dependencies had ended when it started
 * the child), so a retry that revived it `pending` must not leave it there.
 */
export const STAGE_WAITS_FOR_CHILD_SQL = `
UPDATE ratchet.stages SET state = $2::text, deps_left = CASE WHEN $2::text = 'waiting' THEN 1 ELSE 0 END,
  available_at = ratchet.db_now(), updated_at = ratchet.db_now()
WHERE id = $1::bigint AND state IN ('queued', 'pending')`;

/**
 * A child run ($1) its parent's end cancelled, detached from its parent stage by the parent's
 * retry (parent_run_id kept: it stays among the children): the stage's next claim starts a new one.
 */
export const RELEASE_CHILD_RUN_SQL = `
WITH d AS (UPDATE ratchet.runs SET parent_stage_id = NULL, updated_at = ratchet.db_now() WHERE id = $1::uuid AND state = 'cancelled'
  RETURNING id, parent_run_id)
INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
SELECT d.id, NULL, 'child_run_detached', NULL, NULL, ratchet.db_now(), jsonb_build_object('reason', 'parent_retried') FROM d`;

/**
 * One page of runs, newest first, keyset-paginated on (created_at, id): $1 states (or NULL),
 * $2 workflow (or NULL), $3 created at or after (or NULL), $4 created before (or NULL),
 * $5 + $6 the cursor (created_at, id of the last row of the previous page, or NULL), $7 the
 * page size. cursor_ts is created_at to the microsecond, so the next page starts exactly
 * after the last row (a JS Date would round it to the millisecond).
 */
export const LIST_RUNS_SQL = `
SELECT r.id, r.workflow, r.state, r.deadline, r.error, r.created_at, r.updated_at, r.finished_at,
  to_char(r.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS cursor_ts
FROM ratchet.runs r
WHERE ($1::text[] IS NULL OR r.state = ANY($1::text[]))
  AND ($2::text IS NULL OR r.workflow = $2::text)
  AND ($3::timestamptz IS NULL OR r.created_at >= $3::timestamptz)
  AND ($4::timestamptz IS NULL OR r.created_at < $4::timestamptz)
  AND ($5::timestamptz IS NULL OR (r.created_at, r.id) < ($5::timestamptz, $6::uuid))
ORDER BY r.created_at DESC, r.id DESC
LIMIT $7`;

/** Run $1's stages as the planner reads them at a claim (no inputs: a map item's own is on its claim row). */
export const GRAPH_STAGES_SQL = `
SELECT seq, name, tool, state, result, error, item_index, group_seq
FROM ratchet.stages WHERE run_id = $1::uuid ORDER BY seq`;
