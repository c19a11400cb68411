import { CLAIMED_COLUMNS, failRunsFrom } from './lease-common.sql.js';

/**
 * The claim (lease protocol step 1): one statement per purpose, each a single round trip and a
 * single commit; the limited claim's steps run in one short transaction (lease.ts).
 */
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
