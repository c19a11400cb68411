import {
  DB_NOW_EXPR,
  BY_ID_RUNNING,
  NEXT_COLUMNS,
  NEXT_NAMES,
  RUN_ACTIVE,
  STAGE_CANCEL_EVENT,
  STAGE_UNENDED,
  closeWaitsOf,
  settleFrom,
} from './lease-common.sql.js';

/** The event a finish writes for each outcome; a replay finds its own earlier finish by it. */
const outcomeEvent = (outcome: string) => `CASE ${outcome} WHEN 'succeeded' THEN 'stage_succeeded' WHEN 'failed' THEN 'stage_failed'
      WHEN 'cancelled' THEN 'stage_cancelled' WHEN 'skipped' THEN 'stage_skipped' WHEN 'waiting' THEN 'stage_waiting' ELSE 'retry_scheduled' END`;

/**
 * Unended stages of a run that a failure for good (or an explicit end) cancels, from the state table
 * (every source of `cancelled`, awaiting_approval included): running ones see `cancelled` at their next extend.
 */
const UNENDED = STAGE_UNENDED;

/**
 * Finish a batch of attempts of owner $1 in one statement. $3 is their ids (so every lookup of
 * stages goes through the primary key: jsonb_to_recordset's row estimate would otherwise invite
 * a hash join over the whole table). $2 is a JSON array of rows:
 *   { id, fence, outcome: 'succeeded'|'failed'|'queued'|'cancelled'|'skipped'|'waiting', result?, error?, retryDelayMs?,
 *     asValue?, waitFor?, nextSeq?, nextInput?, nextError?, claimNext?, plan?,
 *     runState?: 'succeeded'|'failed'|'cancelled', runResult?, runError?, effectKey?, data? }
 * Each part below is one decision, named for it:
 *   accepted           the fence: each attempt that still holds its stage ends as asked;
 *   refused            the other rows, the only ones looked up further;
 *   replayed           an earlier try of the same row committed and only its answer was lost;
 *   done               the accepted rows that count as done for the run graph: succeeded, skipped, or
 *                      failed as a value (continueOnError; an agent's tool error told to the model);
 *   settle_*           settleFrom('done') (lease-common.sql.ts), the run graph's settle fragment:
 *                      settle_joined: each successor's counter drops under its row lock by the number of its
 *                      dependencies ending here; the finish that brings it to 0 queues it (exactly once:
 *                      a second finish waiting on the row lock re-evaluates on the committed version), or,
 *                      on the fast path (a linear successor, unkeyed), claims it for this owner;
 *                      settle_run_done: the run's sink counter, values accumulated in the runs row's UPDATE;
 *                      settle_parent_woken: a child run that succeeded wakes its parent's waiting stage;
 *   next_failed        a next stage whose input could not be computed, failed with its run;
 *   next_handed_again  on a replay, the next stage the lost finish claimed, handed back to this owner;
 *   planned            stages decided at run time (an agent's answer, a map's items) inserted;
 *   run_ended          an explicit end (a failure for good, an agent's answer); rest_cancelled every other
 *                      unended stage of it, running ones included (the group failure: their next extend says
 *                      `cancelled`, their signal aborts with that reason);
 *   ev                 the events (hashes and ids, never payloads), result_rejected for the rest;
 *   handed             the claim rows of the next stages this owner runs now.
 * Returns every row's verdict: accepted (now or by a replay), the stages it queued (to wake), the next stage to run.
 */
export const FINISH_SQL = `
WITH RECURSIVE clk AS MATERIALIZED (SELECT ${DB_NOW_EXPR} AS t),
req AS (
  SELECT * FROM jsonb_to_recordset($2::jsonb) AS r(id bigint, fence bigint, outcome text, result jsonb, error jsonb,
    "retryDelayMs" int, "asValue" boolean, "waitFor" int, "nextSeq" int, "nextInput" jsonb, "nextError" jsonb, "claimNext" boolean,
    plan jsonb, child jsonb, "runState" text, "runResult" jsonb, "runError" jsonb, "effectKey" text, data jsonb)
),
-- The fence: state = 'running', this owner, this token, lease not expired. Such an attempt ends as
-- asked (a retry is 'queued' again after retryDelayMs; 'waiting' holds no lease and waits for its
-- counter, with a fresh attempt budget for the claim that gathers); any other row changes nothing here.
accepted AS (
  UPDATE ratchet.stages s SET
    state = req.outcome,
    result = CASE WHEN req.outcome = 'succeeded' THEN req.result ELSE s.result END,
    -- a failure kept as a value (continueOnError, a tool error told to the model) is marked: a run retry never takes it
    error = CASE WHEN req.outcome = 'failed' AND coalesce(req."asValue", false)
      THEN coalesce(req.error, s.error, '{}'::jsonb) || '{"asValue": true}'::jsonb ELSE coalesce(req.error, s.error) END,
    effect_key = coalesce(req."effectKey", s.effect_key),
    available_at = CASE WHEN req.outcome = 'queued' THEN clk.t + coalesce(req."retryDelayMs", 0) * interval '1 millisecond' ELSE s.available_at END,
    deps_left = CASE WHEN req.outcome = 'waiting' THEN req."waitFor" ELSE s.deps_left END,
    max_attempts = CASE WHEN req.outcome = 'waiting' THEN s.attempt + s.max_attempts ELSE s.max_attempts END,
    owner_id = CASE WHEN req.outcome = 'waiting' THEN NULL ELSE s.owner_id END,
    lease_until = CASE WHEN req.outcome = 'waiting' THEN NULL ELSE s.lease_until END,
    finished_at = CASE WHEN req.outcome IN ('queued', 'waiting') THEN NULL ELSE clk.t END,
    updated_at = clk.t
  FROM req, clk
  WHERE s.id = ANY($3::bigint[]) AND s.id = req.id AND s.fence = req.fence AND s.owner_id = $1 AND s.state = ${BY_ID_RUNNING}
    AND s.lease_until > clk.t
  RETURNING s.id, s.run_id, s.definition_hash, s.priority, s.fence, s.attempt, s.tool_class, s.available_at, s.seq, s.name,
    coalesce(s.step, s.name) AS step, s.next_seqs, s.sink, req.outcome, req."retryDelayMs" AS retry_delay_ms,
    req.result, req.error, (req.outcome = 'failed' AND coalesce(req."asValue", false)) AS as_value,
    req."nextSeq" AS next_seq, req."nextInput" AS next_input, req."nextError" AS next_error, coalesce(req."claimNext", false) AS claim_next,
    req.plan, req.child, req."runState" AS run_state, req."runResult" AS run_result, req."runError" AS run_error, req.data
),
-- The rows the fence refused: only these are looked up further (a replay, or result_rejected).
refused AS MATERIALIZED (
  SELECT req.* FROM req WHERE NOT EXISTS (SELECT 1 FROM accepted a WHERE a.id = req.id)
),
-- A replay: the event an earlier try of this very row wrote (this stage, this token, this
-- outcome, this owner) shows that it committed and only its answer was lost, whatever the stage
-- did since. Answered as accepted; nothing is written twice and nothing is rejected.
replayed AS (
  SELECT req.id, s.run_id, req.fence, e.attempt, s.next_seqs
  FROM refused req JOIN ratchet.stages s ON s.id = req.id
  CROSS JOIN LATERAL (
    SELECT e.attempt FROM ratchet.events e
    WHERE e.run_id = s.run_id AND e.stage_id = req.id AND e.fence = req.fence
      AND e.type = ${outcomeEvent('req.outcome')} AND e.data->>'owner' = $1
    LIMIT 1
  ) e
  WHERE s.id = ANY($3::bigint[])
),
-- What counts as done for the join and the run's end: succeeded, skipped, or failed as a value;
-- never in a run this statement ends explicitly (a failure for good, an agent's answer). The
-- columns settleFrom (lease-common.sql.ts) reads; its CTEs settle_* follow.
done AS (
  SELECT a.id, a.run_id, a.fence, a.next_seqs, a.next_seq, a.sink, a.step,
    CASE WHEN a.outcome = 'succeeded' THEN a.result WHEN a.as_value THEN jsonb_build_object('ok', false, 'error', a.error) END AS value,
    (a.outcome = 'skipped') AS skipped, a.claim_next, a.next_input
  FROM accepted a
  WHERE (a.outcome IN ('succeeded', 'skipped') OR a.as_value)
    AND NOT EXISTS (SELECT 1 FROM accepted x WHERE x.run_id = a.run_id AND x.run_state IS NOT NULL)
),${settleFrom('done', 'settle', '$1::text')},
-- A next stage whose input could not be computed fails with its run (a retry of the run starts from it).
next_failed AS (
  UPDATE ratchet.stages s SET state = 'failed', error = f.next_error, finished_at = clk.t, updated_at = clk.t
  FROM accepted f, clk
  WHERE f.next_error IS NOT NULL AND f.run_state = 'failed' AND s.run_id = f.run_id AND s.seq = f.next_seq AND s.state = 'pending'
  RETURNING s.id, s.run_id, s.fence, s.attempt, s.error
),
-- On a replay: the next stage the lost finish claimed on the fast path (its job_claimed event
-- names that finish's stage and token), if this owner still holds it under that same token —
-- nobody reclaimed it, and this worker never learned of it. Its lease is renewed and it is
-- handed back, so it runs now on the attempt already counted, instead of waiting out its lease
-- and being claimed again (a second attempt, or none left when maxAttempts is 1).
-- (Driven from the replays alone, the stage found by its primary key: an empty list costs nothing.)
replayed_next AS MATERIALIZED (
  SELECT c.stage_id, c.fence, r.id AS after_id, r.fence AS after_fence
  FROM replayed r
  CROSS JOIN LATERAL (
    SELECT e.stage_id, e.fence FROM ratchet.events e
    WHERE e.run_id = r.run_id AND e.type = 'job_claimed' AND e.data->>'byStage' = r.id::text AND e.data->>'byFence' = r.fence::text
  ) c
),
next_handed_again AS (
  UPDATE ratchet.stages s SET lease_until = clk.t + s.lease_ms * interval '1 millisecond', heartbeat_at = clk.t,
    claimed_at = clk.t, updated_at = clk.t
  FROM replayed_next c, clk
  WHERE s.id = ANY(ARRAY(SELECT stage_id FROM replayed_next)) AND s.id = c.stage_id AND s.fence = c.fence
    AND s.state = ${BY_ID_RUNNING} AND s.owner_id = $1
  RETURNING ${NEXT_COLUMNS}, c.after_id, c.after_fence
),
-- Stages decided at run time (an agent's answer, a map's items), inserted only when the finish
-- that decided them is accepted, in this same statement.
planned AS (
  INSERT INTO ratchet.stages (run_id, definition_hash, seq, name, step, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms,
    max_attempts, idempotency_key, concurrency_key, concurrency_limit, input, deps, next_seqs, deps_left, item_index, group_seq,
    continue_on_error, sink, available_at, created_at, updated_at, priority)
  SELECT f.run_id, f.definition_hash, p.seq, p.name, p.step, p.tool, p."toolClass", p.state, p."leaseMs", p."timeoutMs", p."maxDurationMs",
    p."maxAttempts", coalesce(p."idempotencyKey", f.run_id::text || ':' || p.seq || ':' || p.tool), p."concurrencyKey", p."concurrencyLimit",
    p.input, coalesce(p.deps, '{}'), coalesce(p."nextSeqs", '{}'), coalesce(p."depsLeft", 0), p."itemIndex", p."groupSeq",
    coalesce(p."continueOnError", false), p.sink, clk.t, clk.t, clk.t, f.priority
  FROM accepted f CROSS JOIN LATERAL jsonb_to_recordset(f.plan) AS p(seq int, name text, step text, tool text, "toolClass" text, state text,
    "leaseMs" int, "timeoutMs" int, "maxDurationMs" int, "maxAttempts" int, "idempotencyKey" text, "concurrencyKey" text,
    "concurrencyLimit" int, input jsonb, deps int[], "nextSeqs" int[], "depsLeft" int, "itemIndex" int, "groupSeq" int,
    "continueOnError" boolean, sink text)
  CROSS JOIN clk
  WHERE f.plan IS NOT NULL AND f.run_state IS NULL
  RETURNING id, run_id, tool_class, state, seq, definition_hash
),
run_ended AS (
  UPDATE ratchet.runs r SET state = f.run_state, result = f.run_result, error = f.run_error, finished_at = clk.t, updated_at = clk.t
  FROM (SELECT DISTINCT ON (run_id) * FROM accepted WHERE run_state IS NOT NULL ORDER BY run_id, id) f, clk
  WHERE r.id = f.run_id AND r.state IN (${RUN_ACTIVE})
  RETURNING r.id, r.state, r.parent_stage_id
),
rest_old AS (
  SELECT s.id, s.state FROM ratchet.stages s
  WHERE s.run_id = ANY(ARRAY(SELECT id FROM run_ended)) AND s.state IN (${UNENDED}) AND s.id <> ALL (ARRAY(SELECT id FROM accepted))
    AND NOT EXISTS (SELECT 1 FROM accepted f WHERE f.run_id = s.run_id AND f.next_error IS NOT NULL AND f.next_seq = s.seq)
),
rest_cancelled AS (
  UPDATE ratchet.stages s SET state = 'cancelled', updated_at = clk.t, finished_at = clk.t
  FROM rest_old o, clk
  WHERE s.id = o.id AND s.state IN (${UNENDED})
  RETURNING s.id, s.run_id, s.fence, s.attempt, o.state AS old_state
),
-- A child run started by a waiting stage, keyed by it alone (runs_parent_stage_uq: a retry or a crash
-- never starts a second one). No idempotency key: the submit keys are the users' own. The conflict
-- arbiter is that index only, so the stage goes waiting only with its child there: inserted here,
-- or started before; any other conflict fails the whole finish. The child's deadline is its own
-- workflow's (none without one): its parent's end, expiry included, cancels it (deadline.sql.ts).
child_run AS (
  INSERT INTO ratchet.runs (id, workflow, definition_hash, input, state, deadline, idempotency_key, created_at, updated_at, priority,
    sinks_left, parent_run_id, parent_stage_id)
  SELECT (f.child->>'id')::uuid, f.child->>'workflow', f.child->>'definitionHash', f.child->'input', 'queued',
    clk.t + (f.child->>'deadlineMs')::int * interval '1 millisecond', NULL, clk.t, clk.t, f.priority,
    (f.child->>'sinksLeft')::int, f.run_id, f.id
  FROM accepted f, clk WHERE f.child IS NOT NULL AND f.outcome = 'waiting'
  ON CONFLICT (parent_stage_id) WHERE parent_stage_id IS NOT NULL DO NOTHING
  RETURNING id, definition_hash, priority, parent_run_id, parent_stage_id
),
child_stages AS (
  INSERT INTO ratchet.stages (run_id, definition_hash, seq, name, step, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms,
    max_attempts, idempotency_key, concurrency_key, concurrency_limit, input, deps, next_seqs, deps_left, continue_on_error, sink,
    available_at, created_at, updated_at, priority)
  SELECT c.id, c.definition_hash, p.seq, p.name, p.step, p.tool, p."toolClass", p.state, p."leaseMs", p."timeoutMs", p."maxDurationMs",
    p."maxAttempts", coalesce(p."idempotencyKey", c.id::text || ':' || p.seq || ':' || p.tool), p."concurrencyKey", p."concurrencyLimit",
    p.input, p.deps, p."nextSeqs", p."depsLeft", p."continueOnError", p.sink, clk.t, clk.t, clk.t, c.priority
  FROM child_run c JOIN accepted f ON f.id = c.parent_stage_id
  CROSS JOIN LATERAL jsonb_to_recordset(f.child->'stages') AS p(seq int, name text, step text, tool text, "toolClass" text, state text,
    "leaseMs" int, "timeoutMs" int, "maxDurationMs" int, "maxAttempts" int, "idempotencyKey" text, "concurrencyKey" text,
    "concurrencyLimit" int, input jsonb, deps int[], "nextSeqs" int[], "depsLeft" int, "continueOnError" boolean, sink text)
  CROSS JOIN clk
  RETURNING id, run_id, tool_class, state, definition_hash
),
-- A run that ended here explicitly wakes the stage of its parent that started it (waiting without a
-- lease): claimed again, that stage takes the child's result or error (settle_parent_woken: by its sinks).
parent_woken AS (
  UPDATE ratchet.stages p SET state = 'queued', deps_left = 0, available_at = clk.t, updated_at = clk.t
  FROM run_ended e, clk
  WHERE p.id = e.parent_stage_id AND p.state = 'waiting'
  RETURNING p.id, p.run_id, p.tool_class, p.definition_hash
),
-- A run that failed (or ended otherwise than by success) here cancels its child runs, recursively, and their stages.
descendants(id) AS (
  SELECT c.id FROM ratchet.runs c JOIN run_ended d ON c.parent_run_id = d.id WHERE d.state <> 'succeeded'
  UNION ALL
  SELECT c.id FROM ratchet.runs c JOIN descendants t ON c.parent_run_id = t.id
),
children_cancelled AS (
  UPDATE ratchet.runs r SET state = 'cancelled', finished_at = clk.t, updated_at = clk.t,
    error = jsonb_build_object('code', 'cancelled', 'message', 'its parent run ended')
  FROM descendants t, clk WHERE r.id = t.id AND r.state IN (${RUN_ACTIVE})
  RETURNING r.id
),
-- Stages taken by run_id = ANY(ARRAY(...)) (stages_run_seq_uq), here and in rest_old, never by a join to the
-- CTE: as a hash join the planner put a Seq Scan of stages on the outer side, and the executor read it up to
-- the first unended stage before it found the CTE empty, at every finish (every stage ever kept comes first).
children_stages_cancelled AS (
  UPDATE ratchet.stages s SET state = 'cancelled', finished_at = clk.t, updated_at = clk.t
  FROM clk WHERE s.run_id = ANY(ARRAY(SELECT id FROM children_cancelled)) AND s.state IN (${UNENDED})
  RETURNING s.id
),
-- The open waits (a sleep, a signal, an approval: ratchet.waits) of the stages cancelled here end
-- 'cancelled' in this statement, as CANCEL_RUN_SQL closes them: an approval would otherwise stay open.
waits_closed AS (
  ${closeWaitsOf('(SELECT id FROM rest_cancelled UNION ALL SELECT id FROM children_stages_cancelled) c', "'cancelled'")}
),
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT f.run_id, f.id, ${outcomeEvent('f.outcome')}, f.fence, f.attempt, clk.t,
    coalesce(f.data, '{}'::jsonb) || jsonb_build_object('owner', $1::text) || CASE WHEN f.outcome = 'queued'
      THEN jsonb_build_object('delayMs', f.retry_delay_ms, 'availableAt', f.available_at) ELSE '{}'::jsonb END
      || CASE WHEN f.as_value THEN jsonb_build_object('asValue', true) ELSE '{}'::jsonb END
  FROM accepted f, clk
  UNION ALL
  SELECT x.run_id, x.stage_id, x.type, x.fence, x.attempt, x.at, x.data FROM settle_events x WHERE x.type = 'job_claimed'
  UNION ALL
  SELECT n.run_id, n.id, 'stage_failed', n.fence, n.attempt, clk.t, jsonb_build_object('error', n.error) FROM next_failed n, clk
  UNION ALL
  SELECT d.id, NULL, 'run_' || d.state, NULL, NULL, clk.t, NULL FROM run_ended d, clk
  UNION ALL
  SELECT x.run_id, x.stage_id, x.type, x.fence, x.attempt, x.at, x.data FROM settle_events x WHERE x.type = 'run_succeeded'
  UNION ALL
  SELECT c.run_id, c.id, 'stage_cancelled', c.fence, c.attempt, clk.t, jsonb_build_object('previousState', c.old_state, 'reason', 'run_failed')
  FROM rest_cancelled c, clk WHERE c.old_state IN (${STAGE_CANCEL_EVENT})
  UNION ALL
  SELECT w.run_id, w.stage_id, 'wait_ended', NULL, NULL, clk.t, jsonb_build_object('kind', w.kind, 'outcome', 'cancelled') FROM waits_closed w, clk
  UNION ALL
  SELECT c.parent_run_id, c.parent_stage_id, 'child_run_started', f.fence, f.attempt, clk.t, jsonb_build_object('childRunId', c.id::text)
  FROM child_run c JOIN accepted f ON f.id = c.parent_stage_id CROSS JOIN clk
  UNION ALL
  SELECT c.id, NULL, 'run_submitted', NULL, NULL, clk.t, jsonb_build_object('parentRunId', c.parent_run_id::text,
    'parentStageId', c.parent_stage_id::text, 'stages', (SELECT count(*) FROM child_stages x WHERE x.run_id = c.id))
  FROM child_run c, clk
  UNION ALL
  SELECT c.id, NULL, 'run_cancelled', NULL, NULL, clk.t, jsonb_build_object('reason', 'parent_ended') FROM children_cancelled c, clk
  UNION ALL
  SELECT f.run_id, f.id, 'stages_planned', f.fence, f.attempt, clk.t,
    jsonb_build_object('stages', (SELECT count(*) FROM planned p WHERE p.run_id = f.run_id), 'firstSeq', (SELECT min(seq) FROM planned p WHERE p.run_id = f.run_id))
  FROM accepted f, clk WHERE f.plan IS NOT NULL AND f.run_state IS NULL
  UNION ALL
  SELECT r.run_id, r.id, 'finish_replayed', r.fence, r.attempt, clk.t,
    jsonb_build_object('owner', $1::text, 'nextStageId', h.id::text, 'nextFence', h.fence::text)
  FROM replayed r CROSS JOIN clk LEFT JOIN next_handed_again h ON h.after_id = r.id
  UNION ALL
  SELECT s.run_id, s.id, 'result_rejected', req.fence, s.attempt, clk.t,
    coalesce(req.data, '{}'::jsonb) || jsonb_build_object('owner', $1::text, 'outcome', req.outcome,
      'reason', CASE WHEN s.fence IS DISTINCT FROM req.fence THEN 'stale_fence'
                     WHEN s.state <> 'running' THEN 'stage_' || s.state
                     WHEN s.owner_id IS DISTINCT FROM $1 THEN 'owner_mismatch'
                     ELSE 'lease_expired' END,
      'currentFence', s.fence::text, 'currentState', s.state)
  FROM refused req CROSS JOIN clk
  CROSS JOIN LATERAL (SELECT * FROM ratchet.stages x WHERE x.id = req.id OFFSET 0) s
  WHERE NOT EXISTS (SELECT 1 FROM replayed p WHERE p.id = req.id)
),
-- The next stage handed to this owner, sent as one jsonb per row: only what is not known already.
-- Left out and filled in by finish.ts (handedStage), the same values the claim row has: state
-- 'running', prev_state 'queued', prev_fence NULL (never a reclaim), claimed_at = db_now (clk.t,
-- the outer row's), lease_until = db_now + lease_ms (both writers above set exactly that).
handed AS MATERIALIZED (
  SELECT c.id::text AS id, c.run_id, c.seq, c.name, c.tool, c.tool_class, c.fence::text AS fence, c.attempt, c.max_attempts,
    c.input, c.idempotency_key, c.lease_ms, c.timeout_ms, c.max_duration_ms, c.first_claimed_at, c.error,
    r.workflow, r.definition_hash, r.input AS run_input, r.deadline AS run_deadline, r.traceparent AS run_traceparent, c.after_id
  FROM (SELECT ${NEXT_NAMES}, after_id, after_fence FROM settle_joined WHERE state = 'running'
        UNION ALL SELECT ${NEXT_NAMES}, after_id, after_fence FROM next_handed_again) c
  JOIN ratchet.runs r ON r.id = c.run_id CROSS JOIN clk
),
-- The stages each row made ready, to wake a worker of their class: queued by the join, inserted
-- queued by its plan; on a replay, its successors found queued now.
woken AS (
  SELECT j.after_id AS by_id, j.id, j.tool_class, j.definition_hash FROM settle_joined j WHERE j.state = 'queued'
  UNION ALL
  SELECT f.id, p.id, p.tool_class, p.definition_hash FROM planned p JOIN accepted f ON f.run_id = p.run_id AND f.plan IS NOT NULL WHERE p.state = 'queued'
  UNION ALL
  SELECT r.parent_stage_id, c.id, c.tool_class, c.definition_hash FROM child_stages c JOIN child_run r ON r.id = c.run_id WHERE c.state = 'queued'
  UNION ALL
  SELECT (SELECT min(f.id) FROM accepted f), p.id, p.tool_class, p.definition_hash FROM parent_woken p
  UNION ALL
  SELECT p.by_id, p.id, p.tool_class, p.definition_hash FROM settle_parent_woken p
  UNION ALL
  SELECT r.id, x.id, x.tool_class, x.definition_hash FROM replayed r JOIN ratchet.stages x ON x.run_id = r.run_id AND x.seq = ANY(r.next_seqs) WHERE x.state = 'queued'
)
SELECT req.id::text AS id, (f.id IS NOT NULL OR rp.id IS NOT NULL) AS accepted, (rp.id IS NOT NULL) AS replayed,
  (SELECT coalesce(jsonb_agg(jsonb_build_object('stageId', w.id::text, 'toolClass', w.tool_class, 'definitionHash', w.definition_hash) ORDER BY w.id), '[]'::jsonb)
     FROM woken w WHERE w.by_id = req.id) AS woken,
  coalesce(f.outcome, s.state) AS current_state, s.fence::text AS current_fence, clk.t AS db_now,
  CASE WHEN h.id IS NOT NULL THEN to_jsonb(h) - 'after_id' END AS next_claimed
FROM req CROSS JOIN clk
LEFT JOIN accepted f ON f.id = req.id
LEFT JOIN replayed rp ON rp.id = req.id
LEFT JOIN LATERAL (SELECT x.state, x.fence FROM ratchet.stages x WHERE x.id = req.id OFFSET 0) s ON true
LEFT JOIN handed h ON h.after_id = req.id
ORDER BY req.id`;

/**
 * After a statement that failed runs (the group failure: a finish, or failRunsFrom in the claim's
 * attempts_exhausted, the extend's stage_duration_exceeded, failUnserved): the unended stages of the
 * failed runs of stages $1 (bigint[]) or runs $2 (uuid[]), cancelled by a statement of its own. A
 * concurrent finish that inserted stages into such a run (a map's items, an agent's answer) committed
 * before the failure's rest_cancelled could take its finishing stage's row (it waited on that row
 * lock), or its fence failed and it inserted nothing; either way its rows were not in the failing
 * statement's snapshot, and this next statement sees them. Until it runs, claims skip them
 * (RUN_IS_ACTIVE in claim.sql.ts). Their open waits end `cancelled`, as everywhere.
 */
export const CANCEL_FAILED_LEFTOVERS_SQL = `
WITH clk AS MATERIALIZED (SELECT ${DB_NOW_EXPR} AS t),
failed_runs AS (
  SELECT r.id FROM ratchet.runs r
  WHERE r.state = 'failed' AND (r.id = ANY($2::uuid[]) OR r.id IN (SELECT f.run_id FROM ratchet.stages f WHERE f.id = ANY($1::bigint[])))
),
old AS (
  SELECT s.id, s.state FROM ratchet.stages s JOIN failed_runs r ON s.run_id = r.id WHERE s.state IN (${UNENDED})
),
st AS (
  UPDATE ratchet.stages s SET state = 'cancelled', finished_at = clk.t, updated_at = clk.t
  FROM old, clk WHERE s.id = old.id AND s.state IN (${UNENDED})
  RETURNING s.id, s.run_id, s.fence, s.attempt, old.state AS old_state
),
waits_closed AS (
  ${closeWaitsOf('(SELECT id FROM st) c', "'cancelled'")}
),
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT st.run_id, st.id, 'stage_cancelled', st.fence, st.attempt, clk.t,
    jsonb_build_object('previousState', st.old_state, 'reason', 'run_failed')
  FROM st, clk
  UNION ALL
  SELECT w.run_id, w.stage_id, 'wait_ended', NULL, NULL, clk.t, jsonb_build_object('kind', w.kind, 'outcome', 'cancelled') FROM waits_closed w, clk
)
SELECT (SELECT count(*) FROM st)::int AS cancelled, coalesce((SELECT array_agg(id::text) FROM failed_runs), '{}') AS run_ids`;
