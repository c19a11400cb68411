import { sourcesOf, sqlStates, assertTransition } from '../planner/states.js';

/**
 * The lease protocol's statements: one statement per purpose, each a single round trip
 * and a single commit. Only the database clock (ratchet.db_now()) decides expiry.
 * bigint columns are returned as text so both drivers hand back the same decimal strings.
 */

// Every transition written below must be in the state table; checked when this module loads.
for (const [from, to] of [
  ['queued', 'running'], ['running', 'running'], ['queued', 'failed'], ['running', 'failed'],
  ['running', 'queued'], ['running', 'succeeded'], ['pending', 'queued'], ['pending', 'running'], ['pending', 'cancelled'], ['queued', 'cancelled'],
] as const) assertTransition('stage', from, to);
for (const [from, to] of [['queued', 'running'], ['queued', 'failed'], ['running', 'failed'], ['running', 'succeeded'], ['running', 'expired'], ['running', 'cancelled']] as const) {
  assertTransition('run', from, to);
}

const RUN_ACTIVE = sqlStates(sourcesOf('run', 'failed').filter((s) => sourcesOf('run', 'succeeded').includes(s)));
const STAGE_NOT_STARTED = sqlStates(['pending', 'queued'].filter((s) => sourcesOf('stage', 'cancelled').includes(s as 'pending')));

/**
 * CTE fragments that end a run as failed because of stage rows in `source` (a CTE with
 * run_id, state, error columns) whose state is 'failed': the run becomes failed with the
 * stage's error, and its not-yet-started stages are cancelled. Same words everywhere.
 */
function failRunsFrom(source: string, prefix: string): string {
  return `
${prefix}_run_failed AS (
  UPDATE ratchet.runs r SET state = 'failed', error = src.error, finished_at = clk.t, updated_at = clk.t
  FROM ${source} src, clk
  WHERE r.id = src.run_id AND src.state = 'failed' AND r.state IN (${RUN_ACTIVE})
  RETURNING r.id
),
${prefix}_rest_cancelled AS (
  UPDATE ratchet.stages s SET state = 'cancelled', updated_at = clk.t, finished_at = clk.t
  FROM ${prefix}_run_failed f, clk
  WHERE s.run_id = f.id AND s.state IN (${STAGE_NOT_STARTED})
  RETURNING s.id
),
${prefix}_run_failed_ev AS (
  INSERT INTO ratchet.events (run_id, type, at) SELECT f.id, 'run_failed', clk.t FROM ${prefix}_run_failed f, clk
)`;
}

/** The two index-ordered candidate branches of a claim (see claimSql), each with its own LIMIT. */
function candidates(limit: number, keyed: 'unkeyed' | 'any'): string {
  const key = keyed === 'unkeyed' ? ' AND s.concurrency_key IS NULL' : '';
  return `
queued AS (
  SELECT s.id, s.state AS prev_state, s.owner_id AS prev_owner, s.fence AS prev_fence, s.concurrency_key, s.concurrency_limit
  FROM ratchet.stages s
  WHERE s.state = 'queued' AND s.tool_class = $2 AND s.available_at <= (SELECT t FROM clk)${key}
  ORDER BY s.available_at, s.id
  LIMIT ${limit}
  FOR UPDATE SKIP LOCKED
),
expired AS (
  SELECT s.id, s.state AS prev_state, s.owner_id AS prev_owner, s.fence AS prev_fence, s.concurrency_key, s.concurrency_limit
  FROM ratchet.stages s
  WHERE s.state = 'running' AND s.tool_class = $2 AND s.lease_until < (SELECT t FROM clk)${key}
  ORDER BY s.lease_until, s.id
  LIMIT greatest(${limit} - (SELECT count(*) FROM queued), 0)
  FOR UPDATE SKIP LOCKED
)`;
}

/**
 * The claim itself over the rows of CTE `picked` (id, prev_state, prev_owner, prev_fence),
 * owner $1: a new fencing token from the one sequence, attempt + 1, a lease of the stage's
 * own lease_ms from the database clock; a candidate whose attempt budget is spent becomes
 * `failed` (attempts_exhausted, last error kept) and fails its run instead. Returns each row
 * with lease_until, the database's now, and its run's workflow, definition hash and input.
 */
function claimPicked(): string {
  return `
claimed AS (
  UPDATE ratchet.stages s SET
    state = CASE WHEN s.attempt >= s.max_attempts THEN 'failed' ELSE 'running' END,
    owner_id = CASE WHEN s.attempt >= s.max_attempts THEN s.owner_id ELSE $1 END,
    fence = CASE WHEN s.attempt >= s.max_attempts THEN s.fence ELSE nextval('ratchet.fence_seq') END,
    attempt = CASE WHEN s.attempt >= s.max_attempts THEN s.attempt ELSE s.attempt + 1 END,
    lease_until = CASE WHEN s.attempt >= s.max_attempts THEN s.lease_until ELSE clk.t + s.lease_ms * interval '1 millisecond' END,
    heartbeat_at = CASE WHEN s.attempt >= s.max_attempts THEN s.heartbeat_at ELSE clk.t END,
    claimed_at = CASE WHEN s.attempt >= s.max_attempts THEN s.claimed_at ELSE clk.t END,
    first_claimed_at = coalesce(s.first_claimed_at, clk.t),
    error = CASE WHEN s.attempt >= s.max_attempts
      THEN jsonb_build_object('code', 'attempts_exhausted',
             'message', 'all ' || s.max_attempts || ' attempts were used',
             'attempts', s.attempt, 'lastError', s.error)
      ELSE s.error END,
    finished_at = CASE WHEN s.attempt >= s.max_attempts THEN clk.t ELSE NULL END,
    updated_at = clk.t
  FROM picked p, clk
  WHERE s.id = p.id
  RETURNING s.id, s.run_id, s.seq, s.name, s.tool, s.tool_class, s.state, s.owner_id, s.fence, s.attempt,
    s.max_attempts, s.input, s.idempotency_key, s.lease_until, s.lease_ms, s.timeout_ms,
    s.max_duration_ms, s.claimed_at, s.first_claimed_at, s.error, p.prev_state, p.prev_owner, p.prev_fence
),
run_started AS (
  UPDATE ratchet.runs r SET state = 'running', updated_at = clk.t
  FROM claimed c, clk
  WHERE r.id = c.run_id AND c.state = 'running' AND r.state = 'queued'
  RETURNING r.id
),${failRunsFrom('claimed', 'exhausted')},
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT c.run_id, c.id,
    CASE WHEN c.state = 'failed' THEN 'attempts_exhausted'
         WHEN c.prev_state = 'running' THEN 'lease_reclaimed' ELSE 'job_claimed' END,
    c.fence, c.attempt, clk.t,
    CASE WHEN c.state = 'failed' THEN jsonb_build_object('lastError', c.error -> 'lastError')
         ELSE jsonb_build_object('owner', $1::text, 'leaseUntil', c.lease_until, 'previousOwner', c.prev_owner, 'previousFence', c.prev_fence::text) END
  FROM claimed c, clk
)
SELECT ${CLAIMED_COLUMNS}
FROM claimed c CROSS JOIN clk JOIN ratchet.runs r ON r.id = c.run_id
ORDER BY c.id`;
}

/** What every claim returns per row (c: the claimed stage, r: its run). */
const CLAIMED_COLUMNS = `c.id::text AS id, c.run_id, c.seq, c.name, c.tool, c.tool_class, c.state, c.fence::text AS fence,
  c.attempt, c.max_attempts, c.input, c.idempotency_key, c.lease_until, c.lease_ms,
  c.timeout_ms, c.max_duration_ms, c.claimed_at, c.first_claimed_at, c.error, c.prev_state, c.prev_fence::text AS prev_fence, clk.t AS db_now,
  r.workflow, r.definition_hash, r.input AS run_input, r.deadline AS run_deadline`;

const checkLimit = (limit: number) => {
  if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw new RangeError(`claim limit ${limit}`);
};

/**
 * The fast claim: up to `limit` due stages of tool class $2 for owner $1, in ONE statement.
 * Candidates: `queued` with available_at <= now, or `running` whose lease has expired. Two
 * index-ordered branches (an OR would defeat index order), each FOR UPDATE SKIP LOCKED with
 * its own LIMIT, in CTEs joined to the UPDATE (never `WHERE id IN (... LIMIT n)`, which can
 * touch more than n rows). Stages under a concurrency key are left to the limited claim.
 * The limit is part of the text (one prepared statement per limit, a validated integer
 * 1..1000): with LIMIT as a parameter the generic plan assumes a tenth of the table and
 * PostgreSQL re-plans every call.
 */
export const claimSql = (limit: number): string => {
  checkLimit(limit);
  return `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),${candidates(limit, 'unkeyed')},
picked AS (SELECT id, prev_state, prev_owner, prev_fence FROM queued UNION ALL SELECT id, prev_state, prev_owner, prev_fence FROM expired),${claimPicked()}`;
};

/**
 * The limited claim, step 1 (inside a transaction): lock up to `limit` candidates of class
 * $2 ($1 unused, kept for one parameter shape) and return them with their concurrency key.
 */
export const pickCandidatesSql = (limit: number): string => {
  checkLimit(limit);
  return `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),${candidates(limit, 'any')}
SELECT id::text AS id, concurrency_key, concurrency_limit, $1::text AS owner FROM queued
UNION ALL SELECT id::text AS id, concurrency_key, concurrency_limit, $1::text AS owner FROM expired`;
};

/** The limited claim, last step: claim the stages $2 (ids this transaction already locked) for owner $1. */
export const CLAIM_IDS_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
picked AS (
  SELECT s.id, s.state AS prev_state, s.owner_id AS prev_owner, s.fence AS prev_fence
  FROM ratchet.stages s, clk
  WHERE s.id = ANY($2::bigint[])
    AND ((s.state = 'queued' AND s.available_at <= clk.t) OR (s.state = 'running' AND s.lease_until < clk.t))
),${claimPicked()}`;

/** Serialises the limited claims of one class ($1): transaction-scoped advisory lock. */
export const LOCK_CLASS_SQL = `SELECT pg_advisory_xact_lock(hashtextextended('ratchet:class:' || $1, 0))`;

/** Serialises claims touching concurrency keys $1 (sorted, so two claimers never wait on each other in a cycle). */
export const LOCK_KEYS_SQL = `SELECT pg_advisory_xact_lock(hashtextextended('ratchet:key:' || k, 0)) FROM unnest($1::text[]) AS u(k)`;

/** Live leases of class $1 (running, lease not expired) by the database clock. */
export const COUNT_RUNNING_CLASS_SQL = `
SELECT count(*)::int AS n FROM ratchet.stages
WHERE state = 'running' AND tool_class = $1 AND lease_until >= ratchet.db_now()`;

/** Live leases per concurrency key in $1. */
export const COUNT_RUNNING_KEYS_SQL = `
SELECT concurrency_key AS key, count(*)::int AS n FROM ratchet.stages
WHERE state = 'running' AND concurrency_key = ANY($1::text[]) AND lease_until >= ratchet.db_now()
GROUP BY concurrency_key`;

/** Claims of class $1 started in the last $2 ms (the rate limit's sliding window); prunes older ones. */
export const COUNT_RATE_SQL = `
WITH pruned AS (DELETE FROM ratchet.rate_claims WHERE tool_class = $1 AND at < ratchet.db_now() - $2::int * interval '1 millisecond')
SELECT count(*)::int AS n FROM ratchet.rate_claims WHERE tool_class = $1 AND at >= ratchet.db_now() - $2::int * interval '1 millisecond'`;

/** Records $2 claims of class $1 now, for the rate limit's window. */
export const RECORD_RATE_SQL = `INSERT INTO ratchet.rate_claims (tool_class, at) SELECT $1, ratchet.db_now() FROM generate_series(1, $2::int)`;

/**
 * Extend (heartbeat) every lease of owner $1 in one statement: $2 stage ids, $3 their fences.
 * A lease is extended only while state = 'running', the owner and the fence match and
 * lease_until > now: an expired lease is never revived, even if nobody reclaimed it yet.
 * An attempt past max_duration_ms (counted from claimed_at) is ended by this same statement
 * with stage_duration_exceeded: back to `queued` if attempts remain (it counts against the
 * budget), else `failed` with its run. Returns a verdict for every requested lease:
 * extended | duration_exceeded | cancelled | lost, with lease_until and the database's now.
 */
export const EXTEND_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
req AS (SELECT * FROM unnest($2::bigint[], $3::bigint[]) AS r(id, fence)),
cur AS (
  SELECT s.id, s.run_id, s.state, s.fence, s.attempt, s.max_attempts,
    (s.state = 'running' AND s.owner_id = $1 AND s.lease_until > clk.t) AS held,
    (clk.t >= s.claimed_at + s.max_duration_ms * interval '1 millisecond') AS over_duration
  FROM ratchet.stages s JOIN req ON s.id = req.id AND s.fence = req.fence CROSS JOIN clk
  WHERE s.id = ANY($2::bigint[])
),
ok AS (
  UPDATE ratchet.stages s SET lease_until = clk.t + s.lease_ms * interval '1 millisecond', heartbeat_at = clk.t
  FROM cur, clk
  WHERE s.id = ANY($2::bigint[]) AND s.id = cur.id AND cur.held AND NOT cur.over_duration
    AND s.state = 'running' AND s.owner_id = $1 AND s.fence = cur.fence AND s.lease_until > clk.t
  RETURNING s.id, s.fence, s.lease_until
),
over AS (
  UPDATE ratchet.stages s SET
    state = CASE WHEN s.attempt >= s.max_attempts THEN 'failed' ELSE 'queued' END,
    available_at = clk.t,
    finished_at = CASE WHEN s.attempt >= s.max_attempts THEN clk.t ELSE NULL END,
    error = jsonb_build_object('code', 'stage_duration_exceeded',
      'message', 'attempt ' || s.attempt || ' ran past maxDuration of ' || s.max_duration_ms || ' ms',
      'maxDurationMs', s.max_duration_ms),
    updated_at = clk.t
  FROM cur, clk
  WHERE s.id = ANY($2::bigint[]) AND s.id = cur.id AND cur.held AND cur.over_duration
    AND s.state = 'running' AND s.owner_id = $1 AND s.fence = cur.fence AND s.lease_until > clk.t
  RETURNING s.id, s.run_id, s.state, s.error, s.fence, s.attempt
),${failRunsFrom('over', 'over')},
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT o.run_id, o.id, 'stage_duration_exceeded', o.fence, o.attempt, clk.t, jsonb_build_object('owner', $1::text, 'nextState', o.state)
  FROM over o, clk
  UNION ALL
  SELECT s.run_id, s.id, 'heartbeat_lost', req.fence, s.attempt, clk.t,
    jsonb_build_object('owner', $1::text, 'currentState', s.state, 'currentFence', s.fence::text, 'leaseUntil', s.lease_until)
  FROM req CROSS JOIN clk
  CROSS JOIN LATERAL (SELECT * FROM ratchet.stages x WHERE x.id = req.id OFFSET 0) s
  WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.id = req.id AND cur.fence = req.fence AND cur.held)
    AND NOT (s.state = 'cancelled' AND s.fence = req.fence)
)
SELECT req.id::text AS id, req.fence::text AS fence,
  CASE WHEN ok.id IS NOT NULL THEN 'extended'
       WHEN over.id IS NOT NULL THEN 'duration_exceeded'
       WHEN s.state = 'cancelled' AND s.fence = req.fence THEN 'cancelled'
       ELSE 'lost' END AS verdict,
  coalesce(ok.lease_until, s.lease_until) AS lease_until, s.state AS state, clk.t AS db_now
FROM req CROSS JOIN clk
LEFT JOIN ok ON ok.id = req.id AND ok.fence = req.fence
LEFT JOIN over ON over.id = req.id AND over.fence = req.fence
LEFT JOIN LATERAL (SELECT x.state, x.fence, x.lease_until FROM ratchet.stages x WHERE x.id = req.id OFFSET 0) s ON true
ORDER BY req.id`;

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
  RETURNING s.id, s.run_id, s.fence, s.attempt, s.tool_class, req.outcome, req."retryDelayMs" AS retry_delay_ms,
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
  INSERT INTO ratchet.stages (run_id, seq, name, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms,
    max_attempts, idempotency_key, concurrency_key, concurrency_limit, input, available_at, created_at, updated_at)
  SELECT f.run_id, p.seq, p.name, p.tool, p."toolClass", p.state, p."leaseMs", p."timeoutMs", p."maxDurationMs",
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

/**
 * Release (graceful shutdown): hand leases of owner $1 back at once ($2 ids, $3 fences).
 * The stage is `queued` again, available now; the attempt is not counted against the budget.
 */
export const RELEASE_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
req AS (SELECT * FROM unnest($2::bigint[], $3::bigint[]) AS r(id, fence)),
rel AS (
  UPDATE ratchet.stages s SET state = 'queued', available_at = clk.t, owner_id = NULL, lease_until = NULL,
    attempt = s.attempt - 1, updated_at = clk.t
  FROM req, clk
  WHERE s.id = ANY($2::bigint[]) AND s.id = req.id AND s.fence = req.fence AND s.owner_id = $1 AND s.state = 'running' AND s.lease_until > clk.t
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
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
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

/**
 * Opt-in (never the default): fail `queued` stages of classes $1 — classes no worker has
 * served recently — that have been due for longer than $2 ms, with `no_worker`, and their runs.
 */
export const FAIL_UNSERVED_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
gone AS (
  UPDATE ratchet.stages s SET state = 'failed', finished_at = clk.t, updated_at = clk.t,
    error = jsonb_build_object('code', 'no_worker', 'message', 'no worker served tool class ' || s.tool_class || ' for ' || $2::int || ' ms', 'toolClass', s.tool_class)
  FROM clk
  WHERE s.state = 'queued' AND s.tool_class = ANY($1::text[]) AND s.available_at < clk.t - $2::int * interval '1 millisecond'
  RETURNING s.id, s.run_id, s.state, s.error, s.fence, s.attempt
),${failRunsFrom('gone', 'unserved')},
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT g.run_id, g.id, 'stage_failed', g.fence, g.attempt, clk.t, jsonb_build_object('error', g.error) FROM gone g, clk
)
SELECT count(*)::int AS failed FROM gone`;
