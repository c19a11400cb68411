import { CLAIMED_COLUMNS, RUN_ACTIVE, STAGE_NOT_STARTED } from './lease-common.sql.js';

/** The event a finish writes for each outcome; a replay finds its own earlier finish by it. */
const outcomeEvent = (outcome: string) => `CASE ${outcome} WHEN 'succeeded' THEN 'stage_succeeded' WHEN 'failed' THEN 'stage_failed'
      WHEN 'cancelled' THEN 'stage_cancelled' ELSE 'retry_scheduled' END`;

/** The columns of a next stage handed to this owner (next_stage and next_handed_again return the same). */
const NEXT_COLUMNS = `s.id, s.run_id, s.seq, s.name, s.tool, s.tool_class, s.state, s.owner_id, s.fence, s.attempt,
    s.max_attempts, s.input, s.idempotency_key, s.lease_until, s.lease_ms, s.timeout_ms,
    s.max_duration_ms, s.claimed_at, s.first_claimed_at, s.error, 'queued'::text AS prev_state, NULL::bigint AS prev_fence`;

/**
 * Finish a batch of attempts of owner $1 in one statement. $3 is their ids (so every lookup of
 * stages goes through the primary key: jsonb_to_recordset's row estimate would otherwise invite
 * a hash join over the whole table). $2 is a JSON array of rows:
 *   { id, fence, outcome: 'succeeded'|'failed'|'queued'|'cancelled', result?, error?, retryDelayMs?,
 *     nextSeq?, nextInput?, nextKeepInput?, nextError?, claimNext?, plan?,
 *     runState?: 'succeeded'|'failed'|'expired'|'cancelled', runResult?, runError?, effectKey?, data? }
 * Each part below is one decision, named for it:
 *   accepted           the fence: each attempt that still holds its stage ends as asked;
 *   refused            the other rows, the only ones looked up further;
 *   replayed           an earlier try of the same row committed and only its answer was lost;
 *   next_decided       what happens to the next stage: claimed on the fast path, queued, or failed;
 *   next_stage         that decision written;
 *   next_handed_again  on a replay, the next stage the lost finish claimed, handed back to this owner;
 *   planned            an agent's plan inserted;
 *   run_ended          the run terminal, rest_cancelled its unstarted stages;
 *   ev                 the events (hashes and ids, never payloads), result_rejected for the rest;
 *   handed             the claim rows of the next stages this owner runs now.
 * Returns every row's verdict: accepted (now or by a replay), the next stage to wake or run.
 */
export const FINISH_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
req AS (
  SELECT * FROM jsonb_to_recordset($2::jsonb) AS r(id bigint, fence bigint, outcome text, result jsonb, error jsonb,
    "retryDelayMs" int, "nextSeq" int, "nextInput" jsonb, "nextKeepInput" boolean, "nextError" jsonb, "claimNext" boolean,
    plan jsonb, "runState" text, "runResult" jsonb, "runError" jsonb, "effectKey" text, data jsonb)
),
-- The fence: state = 'running', this owner, this token, lease not expired. Such an attempt ends as
-- asked (a retry is 'queued' again after retryDelayMs); any other row changes nothing here.
accepted AS (
  UPDATE ratchet.stages s SET
    state = req.outcome,
    result = CASE WHEN req.outcome = 'succeeded' THEN req.result ELSE s.result END,
    error = coalesce(req.error, s.error),
    effect_key = coalesce(req."effectKey", s.effect_key),
    available_at = CASE WHEN req.outcome = 'queued' THEN clk.t + coalesce(req."retryDelayMs", 0) * interval '1 millisecond' ELSE s.available_at END,
    finished_at = CASE WHEN req.outcome = 'queued' THEN NULL ELSE clk.t END,
    updated_at = clk.t
  FROM req, clk
  WHERE s.id = ANY($3::bigint[]) AND s.id = req.id AND s.fence = req.fence AND s.owner_id = $1 AND s.state = 'running' AND s.lease_until > clk.t
  RETURNING s.id, s.run_id, s.definition_hash, s.priority, s.fence, s.attempt, s.tool_class, s.available_at, req.outcome, req."retryDelayMs" AS retry_delay_ms,
    req."nextSeq" AS next_seq, req."nextInput" AS next_input, coalesce(req."nextKeepInput", false) AS next_keep_input,
    req."nextError" AS next_error, coalesce(req."claimNext", false) AS claim_next, req.plan, req."runState" AS run_state,
    req."runResult" AS run_result, req."runError" AS run_error, req.data
),
-- The rows the fence refused: only these are looked up further (a replay, or result_rejected).
refused AS MATERIALIZED (
  SELECT req.* FROM req WHERE NOT EXISTS (SELECT 1 FROM accepted a WHERE a.id = req.id)
),
-- A replay: the event an earlier try of this very row wrote (this stage, this token, this
-- outcome, this owner) shows that it committed and only its answer was lost, whatever the stage
-- did since. Answered as accepted; nothing is written twice and nothing is rejected.
replayed AS (
  SELECT req.id, s.run_id, req.fence, e.attempt
  FROM refused req JOIN ratchet.stages s ON s.id = req.id
  CROSS JOIN LATERAL (
    SELECT e.attempt FROM ratchet.events e
    WHERE e.run_id = s.run_id AND e.stage_id = req.id AND e.fence = req.fence
      AND e.type = ${outcomeEvent('req.outcome')} AND e.data->>'owner' = $1
    LIMIT 1
  ) e
  WHERE s.id = ANY($3::bigint[])
),
-- The next stage of an accepted finish (still pending): 'claim' — the fast path, this owner runs
-- it at once (unkeyed stages only: a keyed one must pass the limited claim, so it is queued, never
-- left pending, nor when a due stage of higher priority waits); 'queue' — any worker of its class claims it; 'fail' — its input could not be
-- computed, so it fails with the run, and a retry of the run starts from it.
next_decided AS (
  SELECT s.id, f.id AS after_id, f.fence AS after_fence, f.next_input, f.next_keep_input, f.next_error,
    CASE WHEN f.next_error IS NOT NULL THEN 'fail'
         WHEN f.claim_next AND s.concurrency_key IS NULL AND NOT EXISTS (
           -- priorities (README): a due stage of higher priority of the same class and definition waits, so this one is queued behind it
           SELECT 1 FROM ratchet.stages q WHERE q.state = 'queued' AND q.concurrency_key IS NULL AND q.tool_class = s.tool_class
             AND q.definition_hash = s.definition_hash AND q.priority > s.priority AND q.available_at <= clk.t)
         THEN 'claim' ELSE 'queue' END AS decision
  FROM accepted f JOIN ratchet.stages s ON s.run_id = f.run_id AND s.seq = f.next_seq CROSS JOIN clk
  WHERE f.next_seq IS NOT NULL AND s.state = 'pending'
),
next_stage AS (
  UPDATE ratchet.stages s SET
    state = CASE d.decision WHEN 'claim' THEN 'running' WHEN 'fail' THEN 'failed' ELSE 'queued' END,
    input = CASE WHEN d.decision = 'fail' OR d.next_keep_input THEN s.input ELSE d.next_input END,
    error = CASE WHEN d.decision = 'fail' THEN d.next_error ELSE s.error END,
    finished_at = CASE WHEN d.decision = 'fail' THEN clk.t ELSE s.finished_at END,
    available_at = clk.t, updated_at = clk.t,
    owner_id = CASE WHEN d.decision = 'claim' THEN $1 ELSE s.owner_id END,
    fence = CASE WHEN d.decision = 'claim' THEN nextval('ratchet.fence_seq') ELSE s.fence END,
    attempt = CASE WHEN d.decision = 'claim' THEN s.attempt + 1 ELSE s.attempt END,
    lease_until = CASE WHEN d.decision = 'claim' THEN clk.t + s.lease_ms * interval '1 millisecond' ELSE s.lease_until END,
    heartbeat_at = CASE WHEN d.decision = 'claim' THEN clk.t ELSE s.heartbeat_at END,
    claimed_at = CASE WHEN d.decision = 'claim' THEN clk.t ELSE s.claimed_at END,
    first_claimed_at = CASE WHEN d.decision = 'claim' THEN coalesce(s.first_claimed_at, clk.t) ELSE s.first_claimed_at END
  FROM next_decided d, clk
  WHERE s.id = d.id AND s.state = 'pending'
  RETURNING ${NEXT_COLUMNS}, d.after_id, d.after_fence
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
    AND s.state = 'running' AND s.owner_id = $1
  RETURNING ${NEXT_COLUMNS}, c.after_id, c.after_fence
),
-- An agent's plan: the stages of a validated action list (and the next model call), inserted
-- only when the model stage's finish is accepted, in this same statement.
planned AS (
  INSERT INTO ratchet.stages (run_id, definition_hash, seq, name, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms,
    max_attempts, idempotency_key, concurrency_key, concurrency_limit, input, available_at, created_at, updated_at, priority)
  SELECT f.run_id, f.definition_hash, p.seq, p.name, p.tool, p."toolClass", p.state, p."leaseMs", p."timeoutMs", p."maxDurationMs",
    p."maxAttempts", f.run_id::text || ':' || p.seq || ':' || p.tool, p."concurrencyKey", p."concurrencyLimit", p.input, clk.t, clk.t, clk.t, f.priority
  FROM accepted f CROSS JOIN LATERAL jsonb_to_recordset(f.plan) AS p(seq int, name text, tool text, "toolClass" text, state text,
    "leaseMs" int, "timeoutMs" int, "maxDurationMs" int, "maxAttempts" int, "concurrencyKey" text, "concurrencyLimit" int, input jsonb)
  CROSS JOIN clk
  WHERE f.plan IS NOT NULL
  RETURNING id, run_id, tool_class, state, seq
),
run_ended AS (
  UPDATE ratchet.runs r SET state = f.run_state, result = f.run_result, error = f.run_error, finished_at = clk.t, updated_at = clk.t
  FROM accepted f, clk
  WHERE f.run_state IS NOT NULL AND r.id = f.run_id AND r.state IN (${RUN_ACTIVE})
  RETURNING r.id, r.state
),
rest_cancelled AS (
  UPDATE ratchet.stages s SET state = 'cancelled', updated_at = clk.t, finished_at = clk.t
  FROM run_ended d, clk
  WHERE s.run_id = d.id AND s.state IN (${STAGE_NOT_STARTED}) AND NOT EXISTS (SELECT 1 FROM next_decided x WHERE x.id = s.id)
  RETURNING s.id
),
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT f.run_id, f.id, ${outcomeEvent('f.outcome')}, f.fence, f.attempt, clk.t,
    coalesce(f.data, '{}'::jsonb) || jsonb_build_object('owner', $1::text) || CASE WHEN f.outcome = 'queued'
      THEN jsonb_build_object('delayMs', f.retry_delay_ms, 'availableAt', f.available_at) ELSE '{}'::jsonb END
  FROM accepted f, clk
  UNION ALL
  SELECT n.run_id, n.id, CASE n.state WHEN 'running' THEN 'job_claimed' ELSE 'stage_failed' END, n.fence, n.attempt, clk.t,
    CASE n.state WHEN 'running' THEN jsonb_build_object('owner', $1::text, 'leaseUntil', n.lease_until, 'fastPath', true,
        'byStage', n.after_id::text, 'byFence', n.after_fence::text)
      ELSE jsonb_build_object('error', n.error) END
  FROM next_stage n, clk WHERE n.state IN ('running', 'failed')
  UNION ALL
  SELECT d.id, NULL, 'run_' || d.state, NULL, NULL, clk.t, NULL FROM run_ended d, clk
  UNION ALL
  SELECT f.run_id, f.id, 'stages_planned', f.fence, f.attempt, clk.t,
    jsonb_build_object('stages', (SELECT count(*) FROM planned p WHERE p.run_id = f.run_id), 'firstSeq', (SELECT min(seq) FROM planned p WHERE p.run_id = f.run_id))
  FROM accepted f, clk WHERE f.plan IS NOT NULL
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
handed AS MATERIALIZED (
  SELECT ${CLAIMED_COLUMNS}, c.after_id
  FROM (SELECT * FROM next_stage WHERE state = 'running' UNION ALL SELECT * FROM next_handed_again) c
  JOIN ratchet.runs r ON r.id = c.run_id CROSS JOIN clk
)
SELECT req.id::text AS id, (f.id IS NOT NULL OR rp.id IS NOT NULL) AS accepted, (rp.id IS NOT NULL) AS replayed,
  coalesce(n.id, pq.id, wq.id)::text AS next_stage_id, coalesce(n.tool_class, pq.tool_class, wq.tool_class) AS next_tool_class,
  coalesce(f.outcome, s.state) AS current_state, s.fence::text AS current_fence, clk.t AS db_now,
  CASE WHEN h.id IS NOT NULL THEN to_jsonb(h) END AS next_claimed
FROM req CROSS JOIN clk
LEFT JOIN accepted f ON f.id = req.id
LEFT JOIN replayed rp ON rp.id = req.id
LEFT JOIN next_stage n ON n.after_id = req.id AND n.state IN ('queued', 'running')
LEFT JOIN planned pq ON pq.run_id = f.run_id AND pq.state = 'queued'
LEFT JOIN LATERAL (
  SELECT x.id, x.tool_class FROM ratchet.stages x
  WHERE rp.id IS NOT NULL AND x.run_id = rp.run_id AND x.seq = req."nextSeq" AND x.state = 'queued' OFFSET 0
) wq ON true
LEFT JOIN LATERAL (SELECT x.state, x.fence FROM ratchet.stages x WHERE x.id = req.id OFFSET 0) s ON true
LEFT JOIN handed h ON h.after_id = req.id
ORDER BY req.id`;
