import { CLAIMED_COLUMNS, RUN_ACTIVE, STAGE_NOT_STARTED } from './lease-common.sql.js';

/**
 * Finish a batch of attempts of owner $1 in one statement. $3 is their ids (so every lookup of
 * stages goes through the primary key: jsonb_to_recordset's row estimate would otherwise invite
 * a hash join over the whole table). $2 is a JSON array of rows:
 *   { id, fence, outcome: 'succeeded'|'failed'|'queued'|'cancelled', result?, error?, retryDelayMs?,
 *     nextSeq?, nextInput?, runState?: 'succeeded'|'failed'|'expired'|'cancelled', runResult?, runError?, data? }
 * Each row is fenced on its own: state = 'running', owner, fence, lease_until > now. With it,
 * in the same statement, the dispatcher's decision: the next stage `queued` with its input,
 * a retry `queued` after retryDelayMs, or the run terminal (its unstarted stages cancelled).
 * A row that fails the fence changes nothing and leaves a `result_rejected` event (with the
 * result's hash from `data`, never the payload). Returns every row's verdict.
 */
export const FINISH_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
req AS (
  SELECT * FROM jsonb_to_recordset($2::jsonb) AS r(id bigint, fence bigint, outcome text, result jsonb, error jsonb,
    "retryDelayMs" int, "nextSeq" int, "nextInput" jsonb, "nextKeepInput" boolean, "claimNext" boolean, plan jsonb,
    "runState" text, "runResult" jsonb, "runError" jsonb, data jsonb)
),
fin AS (
  UPDATE ratchet.stages s SET
    state = req.outcome,
    result = CASE WHEN req.outcome = 'succeeded' THEN req.result ELSE s.result END,
    error = coalesce(req.error, s.error),
    available_at = CASE WHEN req.outcome = 'queued' THEN clk.t + coalesce(req."retryDelayMs", 0) * interval '1 millisecond' ELSE s.available_at END,
    finished_at = CASE WHEN req.outcome = 'queued' THEN NULL ELSE clk.t END,
    updated_at = clk.t
  FROM req, clk
  WHERE s.id = ANY($3::bigint[]) AND s.id = req.id AND s.fence = req.fence AND s.owner_id = $1 AND s.state = 'running' AND s.lease_until > clk.t
  RETURNING s.id, s.run_id, s.definition_hash, s.fence, s.attempt, s.tool_class, req.outcome, req."retryDelayMs" AS retry_delay_ms,
    req."nextSeq" AS next_seq, req."nextInput" AS next_input, coalesce(req."nextKeepInput", false) AS next_keep_input,
    coalesce(req."claimNext", false) AS claim_next, req.plan, req."runState" AS run_state,
    req."runResult" AS run_result, req."runError" AS run_error, req.data, s.available_at
),
next_queued AS (
  -- The next stage becomes queued with its input; on the fast path (claimNext) this same
  -- statement also claims it for owner $1 (pending -> running), so a run moving through one
  -- worker costs one commit per stage.
  UPDATE ratchet.stages s SET
    state = CASE WHEN f.claim_next THEN 'running' ELSE 'queued' END,
    input = CASE WHEN f.next_keep_input THEN s.input ELSE f.next_input END, available_at = clk.t, updated_at = clk.t,
    owner_id = CASE WHEN f.claim_next THEN $1 ELSE s.owner_id END,
    fence = CASE WHEN f.claim_next THEN nextval('ratchet.fence_seq') ELSE s.fence END,
    attempt = CASE WHEN f.claim_next THEN s.attempt + 1 ELSE s.attempt END,
    lease_until = CASE WHEN f.claim_next THEN clk.t + s.lease_ms * interval '1 millisecond' ELSE s.lease_until END,
    heartbeat_at = CASE WHEN f.claim_next THEN clk.t ELSE s.heartbeat_at END,
    claimed_at = CASE WHEN f.claim_next THEN clk.t ELSE s.claimed_at END,
    first_claimed_at = CASE WHEN f.claim_next THEN clk.t ELSE s.first_claimed_at END
  FROM fin f, clk
  WHERE f.next_seq IS NOT NULL AND s.run_id = f.run_id AND s.seq = f.next_seq AND s.state = 'pending'
    AND (NOT f.claim_next OR s.concurrency_key IS NULL)
  RETURNING s.id, s.run_id, s.seq, s.name, s.tool, s.tool_class, s.state, s.owner_id, s.fence, s.attempt,
    s.max_attempts, s.input, s.idempotency_key, s.lease_until, s.lease_ms, s.timeout_ms,
    s.max_duration_ms, s.claimed_at, s.first_claimed_at, s.error, 'queued'::text AS prev_state, NULL::bigint AS prev_fence
),
planned AS (
  -- An agent's plan: the stages of a validated action list (and the next model call), inserted
  -- only when the model stage's finish is accepted, in this same statement.
  INSERT INTO ratchet.stages (run_id, definition_hash, seq, name, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms,
    max_attempts, idempotency_key, concurrency_key, concurrency_limit, input, available_at, created_at, updated_at)
  SELECT f.run_id, f.definition_hash, p.seq, p.name, p.tool, p."toolClass", p.state, p."leaseMs", p."timeoutMs", p."maxDurationMs",
    p."maxAttempts", f.run_id::text || ':' || p.seq || ':' || p.tool, p."concurrencyKey", p."concurrencyLimit", p.input, clk.t, clk.t, clk.t
  FROM fin f CROSS JOIN LATERAL jsonb_to_recordset(f.plan) AS p(seq int, name text, tool text, "toolClass" text, state text,
    "leaseMs" int, "timeoutMs" int, "maxDurationMs" int, "maxAttempts" int, "concurrencyKey" text, "concurrencyLimit" int, input jsonb)
  CROSS JOIN clk
  WHERE f.plan IS NOT NULL
  RETURNING id, run_id, tool_class, state, seq
),
run_done AS (
  UPDATE ratchet.runs r SET state = f.run_state, result = f.run_result, error = f.run_error, finished_at = clk.t, updated_at = clk.t
  FROM fin f, clk
  WHERE f.run_state IS NOT NULL AND r.id = f.run_id AND r.state IN (${RUN_ACTIVE})
  RETURNING r.id, r.state
),
rest_cancelled AS (
  UPDATE ratchet.stages s SET state = 'cancelled', updated_at = clk.t, finished_at = clk.t
  FROM run_done d, clk
  WHERE s.run_id = d.id AND s.state IN (${STAGE_NOT_STARTED})
  RETURNING s.id
),
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT f.run_id, f.id,
    CASE f.outcome WHEN 'succeeded' THEN 'stage_succeeded' WHEN 'failed' THEN 'stage_failed'
      WHEN 'cancelled' THEN 'stage_cancelled' ELSE 'retry_scheduled' END,
    f.fence, f.attempt, clk.t,
    coalesce(f.data, '{}'::jsonb) || CASE WHEN f.outcome = 'queued'
      THEN jsonb_build_object('delayMs', f.retry_delay_ms, 'availableAt', f.available_at) ELSE '{}'::jsonb END
  FROM fin f, clk
  UNION ALL
  SELECT d.id, NULL, 'run_' || d.state, NULL, NULL, clk.t, NULL FROM run_done d, clk
  UNION ALL
  SELECT n.run_id, n.id, 'job_claimed', n.fence, n.attempt, clk.t, jsonb_build_object('owner', $1::text, 'leaseUntil', n.lease_until, 'fastPath', true)
  FROM next_queued n, clk WHERE n.state = 'running'
  UNION ALL
  SELECT f.run_id, f.id, 'stages_planned', f.fence, f.attempt, clk.t,
    jsonb_build_object('stages', (SELECT count(*) FROM planned p WHERE p.run_id = f.run_id), 'firstSeq', (SELECT min(seq) FROM planned p WHERE p.run_id = f.run_id))
  FROM fin f, clk WHERE f.plan IS NOT NULL
  UNION ALL
  SELECT s.run_id, s.id, 'result_rejected', req.fence, s.attempt, clk.t,
    coalesce(req.data, '{}'::jsonb) || jsonb_build_object('owner', $1::text, 'outcome', req.outcome,
      'reason', CASE WHEN s.fence IS DISTINCT FROM req.fence THEN 'stale_fence'
                     WHEN s.state <> 'running' THEN 'stage_' || s.state
                     WHEN s.owner_id IS DISTINCT FROM $1 THEN 'owner_mismatch'
                     ELSE 'lease_expired' END,
      'currentFence', s.fence::text, 'currentState', s.state)
  FROM req CROSS JOIN clk
  CROSS JOIN LATERAL (SELECT * FROM ratchet.stages x WHERE x.id = req.id OFFSET 0) s
  WHERE NOT EXISTS (SELECT 1 FROM fin WHERE fin.id = req.id)
),
nc AS MATERIALIZED (
  SELECT ${CLAIMED_COLUMNS}
  FROM next_queued c JOIN ratchet.runs r ON r.id = c.run_id CROSS JOIN clk
  WHERE c.state = 'running'
)
SELECT req.id::text AS id, (f.id IS NOT NULL) AS accepted, coalesce(n.id, pq.id)::text AS next_stage_id, coalesce(n.tool_class, pq.tool_class) AS next_tool_class,
  coalesce(f.outcome, s.state) AS current_state, s.fence::text AS current_fence, clk.t AS db_now,
  CASE WHEN n.state = 'running' THEN to_jsonb(nc) END AS next_claimed
FROM req CROSS JOIN clk
LEFT JOIN fin f ON f.id = req.id
LEFT JOIN next_queued n ON n.run_id = f.run_id
LEFT JOIN planned pq ON pq.run_id = f.run_id AND pq.state = 'queued'
LEFT JOIN LATERAL (SELECT x.state, x.fence FROM ratchet.stages x WHERE x.id = req.id OFFSET 0) s ON true
LEFT JOIN nc ON nc.id = n.id::text
ORDER BY req.id`;
