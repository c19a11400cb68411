import { DB_NOW_EXPR, CLAIMED_COLUMNS, failRunsFrom, failedAsValue, RUN_ACTIVE, settleFrom } from './lease-common.sql.js';

/**
 * The claim (lease protocol step 1): one statement per purpose, each a single round trip and a
 * single commit; the limited claim's steps run in one short transaction, made again (at most
 * twice) for keys another claimer held (claim.ts).
 *
 * Every claim names the definition hashes its worker has loaded ($3, a text[]): a stage is a
 * candidate only when its run started with one of them, so a worker never maps a run onto
 * steps it does not have, and leaves it (no attempt spent) to a worker that has them. Each kind
 * of candidate is read as one index range per hash, merged in index order (a Merge Append, so a
 * backlog of another version is never read), and locked lazily in that order, row by row, with
 * FOR UPDATE SKIP LOCKED: only the rows the LIMIT takes are locked. (FOR UPDATE inside each
 * UNION ALL arm would lock every row of every arm before the merge: the planner does not push
 * the LIMIT through a locking subquery.)
 */

/** At most this many definition hashes in one claim (each is one index range per branch). */
export const MAX_CLAIM_DEFINITIONS = 100;
/** At most this many concurrency keys are looked at by one keyed claim; the next claim goes on from the last one. */
export const MAX_KEYS_VISITED = 200;

const CLK = '(SELECT t FROM clk)';
const DUE = `s.state = 'queued' AND s.available_at <= ${CLK}`;
const EXPIRED = `s.state = 'running' AND s.lease_until < ${CLK}`;
/**
 * Checked on each row a claim locks (one primary-key probe): a stage whose run is no longer
 * active is never claimed. A finish that inserts an agent's plan while the expiry (or a cancel)
 * ends the run commits rows that statement's snapshot did not see; they stay queued in an ended
 * run until CANCEL_LEFTOVERS_SQL (deadline.sql.ts) cancels them, and no claim takes them meanwhile.
 */
const RUN_IS_ACTIVE = `EXISTS (SELECT 1 FROM ratchet.runs r WHERE r.id = s.run_id AND r.state IN (${RUN_ACTIVE}))`;

/**
 * The order a claim takes due stages in (README "Priorities"): `priority` — higher priority
 * first, then the oldest (stages_queued_priority_idx, stages_queued_key_priority_idx); `age` —
 * the oldest first whatever their priority (stages_queued_claim_idx, stages_queued_key_idx).
 * Each process takes one claim in AGE_SHARE of a class by age, so under a constant stream of
 * higher-priority runs a lower one still becomes the oldest due stage and is claimed: no stage
 * starves, and its wait is bounded by the number of due stages older than it.
 */
export type ClaimOrder = 'priority' | 'age';
export const AGE_SHARE = 4;

/**
 * How many candidates each index range offers a claim of `limit`: enough to step over the rows
 * other claimers hold (SKIP LOCKED) or that fail the recheck. The bound also makes PostgreSQL plan
 * each range for its first rows: without it a range ordered by (priority DESC, available_at) is
 * planned for all its rows, and a bitmap scan plus a sort of the whole due backlog looks cheaper.
 */
export const rangeLimit = (limit: number): number => limit * 4 + 100;

/**
 * Candidate ids (and their order columns `pr`, `at`) of class $2 matching `where`, one
 * index-ordered range per hash of $3 (at most rangeLimit rows each), merged by (pr DESC, at, id).
 * Nothing is locked here.
 */
function perDefinition(hashes: number, where: string, order: 'available_at' | 'lease_until', by: ClaimOrder, limit: number): string {
  const pr = by === 'priority' ? 's.priority' : '0';
  const prOrder = by === 'priority' ? 's.priority DESC NULLS LAST, ' : '';
  const arm = (i: number) => `(SELECT s.id, ${pr} AS pr, s.${order} AS at FROM ratchet.stages s
    WHERE ${where} AND s.tool_class = $2 AND s.definition_hash = ($3::text[])[${i}] ORDER BY ${prOrder}s.${order}, s.id LIMIT ${rangeLimit(limit)})`;
  if (hashes === 1) return arm(1).slice(1, -1); // one range: already in order
  return `${Array.from({ length: hashes }, (_, i) => arm(i + 1)).join('\n  UNION ALL ')}
  ORDER BY pr DESC NULLS LAST, at, id`;
}

/** Locks the rows of candidate CTE `ids` in their order, skipping those another claimer holds, while `recheck` holds, up to `limit`. */
function lockInOrder(ids: string, recheck: string, limit: string): string {
  return `SELECT l.* FROM ${ids} c CROSS JOIN LATERAL (
    SELECT s.id, s.state AS prev_state, s.owner_id AS prev_owner, s.fence AS prev_fence, s.concurrency_key, s.concurrency_limit, c.pr, c.at
    FROM ratchet.stages s WHERE s.id = c.id AND ${recheck} AND ${RUN_IS_ACTIVE} FOR UPDATE OF s SKIP LOCKED
  ) l
  LIMIT ${limit}`;
}

/**
 * Expired leases (`expired`) first, then due stages without a concurrency key (`queued`, filling
 * what is left of `limit`, or `limit` of their own when `queuedLimit` says so; the limited claim
 * then ranks expired leases first too); `keyed` expired leases are included when the caller
 * counts keys (the limited claim).
 *
 * Why expired leases first: an expired lease is work already started whose owner is gone (a
 * crash, a pause past its lease); its stage was due before any stage queued after its claim,
 * and its run waits on it (issue 13: reclaim within the lease + 1 s). Taken after the due
 * backlog, as before, it waited until that backlog fell below a claim's limit: a worker with
 * one free slot never took it while one due stage was left. It starves nothing: each reclaim
 * spends an attempt (max_attempts bounds how often one stage can come back expired) and gives
 * a live lease, so expired leases are a bounded trickle, never a stream.
 */
function candidates(hashes: number, limit: number, keyed: boolean, queuedLimit: 'fill' | 'own', by: ClaimOrder): string {
  const expiredKey = keyed ? '' : ' AND s.concurrency_key IS NULL';
  return `
expired_ids AS (
  ${perDefinition(hashes, `${EXPIRED}${expiredKey}`, 'lease_until', 'age', limit)}
),
expired AS (
  ${lockInOrder('expired_ids', EXPIRED, String(limit))}
),
queued_ids AS (
  ${perDefinition(hashes, `${DUE} AND s.concurrency_key IS NULL`, 'available_at', by, limit)}
),
queued AS (
  ${lockInOrder('queued_ids', DUE, queuedLimit === 'fill' ? `greatest(${limit} - (SELECT count(*) FROM expired), 0)` : String(limit))}
)`;
}

/**
 * Due stages under concurrency keys with room, whatever the backlog of saturated keys: a walk
 * over the class's distinct keys (one index descent each on stages_queued_key_idx, a loose index
 * scan) from the key after cursor $4, round the end and back to the cursor, that stops after
 * MAX_KEYS_VISITED keys or once `limit` stages are found. Per key it counts the live leases (as
 * COUNT_RUNNING_KEYS does) and the due stages of the loaded definitions, so a saturated key
 * costs a few index probes and none of its backlog is read. Then each key with room gives its
 * oldest due stages (up to its room), merged by (available_at, id) and locked lazily. The room
 * is an estimate read before the keys are locked; the limited claim counts again under the
 * key locks (claim.ts). `walk` also returns the cursor for the next claim: the last key visited.
 * Order 'priority': the walk does not stop once `limit` stages are found (the first keys would fill
 * the claim whatever the priorities further on) but once `limit` stages of the highest priority seen
 * so far are found (`best`, `nbest`: a higher priority starts the count again), or after
 * MAX_KEYS_VISITED keys; each key offers its best stages up to its room, and the claim takes the
 * highest priorities among them. A higher priority under a key further on than where the walk
 * stopped waits for a later claim (the cursor moves on). Visiting every key up to the bound made the
 * keyed claim ~3x slower with 1,000 keys (README, Benchmarks). Order 'age' stops at `limit`.
 */
/** Below every priority (a null priority sorts last, as this). */
const LOWEST = '(-2147483649)';

function keyedCandidates(limit: number, by: ClaimOrder): string {
  const key = `s.state = 'queued' AND s.tool_class = $2 AND s.concurrency_key IS NOT NULL`;
  const pr = by === 'priority' ? 's.priority' : '0';
  const prOrder = by === 'priority' ? 's.priority DESC NULLS LAST, ' : '';
  const dueOfKey = (
    k: string,
    n: string,
  ) => `SELECT s.id, ${pr} AS pr, s.available_at AS at, s.concurrency_limit AS lim FROM ratchet.stages s
        WHERE ${key} AND s.concurrency_key = ${k} AND s.definition_hash = u.hash AND s.available_at <= ${CLK}
        ORDER BY ${prOrder}s.available_at, s.id LIMIT ${n}`;
  return `
walk(k, visited, found, wrapped, take, best, nbest) AS (
  SELECT $4::text, 0, 0, false, 0, ${LOWEST}::int8, 0
  UNION ALL
  SELECT nx.k, w.visited + 1, w.found + tk.take, nx.wrapped, tk.take,
    CASE WHEN tk.take > 0 AND tk.kb > w.best THEN tk.kb ELSE w.best END,
    CASE WHEN tk.take = 0 THEN w.nbest WHEN tk.kb > w.best THEN least(tk.take, tk.nkb)
      WHEN tk.kb = w.best THEN w.nbest + least(tk.take, tk.nkb) ELSE w.nbest END
  FROM walk w
  CROSS JOIN LATERAL (SELECT (SELECT s.concurrency_key FROM ratchet.stages s WHERE ${key} AND s.concurrency_key > w.k
    ORDER BY s.concurrency_key LIMIT 1) AS k OFFSET 0) a
  CROSS JOIN LATERAL (SELECT coalesce(a.k, CASE WHEN NOT w.wrapped THEN (SELECT s.concurrency_key FROM ratchet.stages s WHERE ${key}
    ORDER BY s.concurrency_key LIMIT 1) END) AS k, w.wrapped OR a.k IS NULL AS wrapped OFFSET 0) nx
  CROSS JOIN LATERAL (
    SELECT least(greatest(d.lim - (SELECT count(*)::int FROM ratchet.stages r
      WHERE r.state = 'running' AND r.concurrency_key = nx.k AND r.lease_until >= ${CLK}), 0), d.due) AS take, d.kb, d.nkb
    FROM (SELECT count(*)::int AS due, min(h.lim) AS lim, max(h.p) AS kb, (count(*) FILTER (WHERE h.p = h.mx))::int AS nkb
      FROM (SELECT h.lim, coalesce(h.pr, ${LOWEST})::int8 AS p, max(coalesce(h.pr, ${LOWEST})::int8) OVER () AS mx
        FROM unnest($3::text[]) AS u(hash) CROSS JOIN LATERAL (${dueOfKey('nx.k', String(limit))}) h) h) d
    OFFSET 0
  ) tk
  WHERE w.visited < ${MAX_KEYS_VISITED} AND ${by === 'priority' ? 'w.nbest' : 'w.found'} < ${limit} AND nx.k IS NOT NULL
    AND NOT (nx.wrapped AND nx.k > $4::text)
),
keyed_ids AS (
  SELECT x.id, x.pr, x.at FROM (
    SELECT h.id, h.pr, h.at, w.take, w.visited AS vis,
      row_number() OVER (PARTITION BY w.k ORDER BY h.pr DESC NULLS LAST, h.at, h.id) AS rn
    FROM walk w CROSS JOIN unnest($3::text[]) AS u(hash) CROSS JOIN LATERAL (${dueOfKey('w.k', 'w.take')}) h
    WHERE w.take > 0
  ) x
  WHERE x.rn <= x.take
  ORDER BY x.pr DESC NULLS LAST, ${by === 'priority' ? 'x.vis, ' : ''}x.at, x.id
),
keyed AS (
  ${lockInOrder('keyed_ids', DUE, String(limit))}
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
        -- a failure kept as a value (continueOnError; an agent's tool error told to the model) is marked, as the finish marks it
        || CASE WHEN s.continue_on_error THEN '{"asValue": true}'::jsonb ELSE '{}'::jsonb END
      ELSE s.error END,
    finished_at = CASE WHEN s.attempt >= s.max_attempts THEN clk.t ELSE NULL END,
    updated_at = clk.t
  FROM picked p, clk
  WHERE s.id = p.id
  RETURNING s.id, s.run_id, s.seq, s.name, s.tool, s.tool_class, s.state, s.owner_id, s.fence, s.attempt,
    s.max_attempts, s.input, s.idempotency_key, s.lease_until, s.lease_ms, s.timeout_ms,
    s.max_duration_ms, s.claimed_at, s.first_claimed_at, s.error, p.prev_state, p.prev_owner, p.prev_fence,
    s.continue_on_error, s.next_seqs, s.sink, coalesce(s.step, s.name) AS step
),
run_started AS (
  UPDATE ratchet.runs r SET state = 'running', updated_at = clk.t
  FROM claimed c, clk
  WHERE r.id = c.run_id AND c.state = 'running' AND r.state = 'queued'
  RETURNING r.id
),
-- A spent budget fails the run, unless the stage's failure is a value: then it counts as done (settleFrom).
exhausted_failed AS (SELECT * FROM claimed WHERE NOT continue_on_error),${failRunsFrom('exhausted_failed', 'exhausted')},
${failedAsValue('claimed', 'exhausted_value')},${settleFrom('exhausted_value', 'exhausted_settle')},
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT c.run_id, c.id,
    CASE WHEN c.state = 'failed' THEN 'attempts_exhausted'
         WHEN c.prev_state = 'running' THEN 'lease_reclaimed' ELSE 'job_claimed' END,
    c.fence, c.attempt, clk.t,
    CASE WHEN c.state = 'failed' THEN jsonb_build_object('lastError', c.error -> 'lastError')
           || CASE WHEN c.continue_on_error THEN '{"asValue": true}'::jsonb ELSE '{}'::jsonb END
         ELSE jsonb_build_object('owner', $1::text, 'leaseUntil', c.lease_until, 'previousOwner', c.prev_owner, 'previousFence', c.prev_fence::text) END
  FROM claimed c, clk
  UNION ALL
  SELECT x.run_id, x.stage_id, x.type, x.fence, x.attempt, x.at, x.data FROM exhausted_settle_events x
)
SELECT ${CLAIMED_COLUMNS}
FROM claimed c CROSS JOIN clk JOIN ratchet.runs r ON r.id = c.run_id
ORDER BY c.id`;
}

function check(limit: number, hashes: number): void {
  if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw new RangeError(`claim limit ${limit}`);
  if (!Number.isInteger(hashes) || hashes < 1 || hashes > MAX_CLAIM_DEFINITIONS) throw new RangeError(`claim definitions ${hashes}`);
}

/**
 * The fast claim: up to `limit` due stages of tool class $2 started with one of the `hashes`
 * definition hashes in $3, for owner $1, in ONE statement. Candidates: `running` whose lease has
 * expired (first), then `queued` with available_at <= now. Two index-ordered branches (an OR
 * would defeat index order), each locked lazily FOR UPDATE SKIP LOCKED with its own LIMIT, in
 * CTEs joined to the UPDATE (never `WHERE id IN (... LIMIT n)`, which can touch more than n
 * rows). Stages under a concurrency key are left to the limited claim. The limit and the
 * number of hashes are part of the text (one prepared statement per pair, validated integers):
 * with LIMIT as a parameter the generic plan assumes a tenth of the table and PostgreSQL
 * re-plans every call.
 */
export const claimSql = (limit: number, hashes: number, by: ClaimOrder = 'priority'): string => {
  check(limit, hashes);
  return `
WITH RECURSIVE clk AS MATERIALIZED (SELECT ${DB_NOW_EXPR} AS t),${candidates(hashes, limit, false, 'fill', by)},
picked AS (SELECT id, prev_state, prev_owner, prev_fence FROM expired UNION ALL SELECT id, prev_state, prev_owner, prev_fence FROM queued),${claimPicked()}`;
};

/**
 * The limited claim, step 1 (inside a transaction): lock up to `limit` candidates of each kind
 * for class $2 and definitions $3 ($1 unused, kept for one parameter shape), expired leases
 * first (see candidates()), then by priority and when they became claimable, with their
 * concurrency key and limit (claim.ts takes them in this order, so an expired keyed lease gets
 * its key's room before a due stage of that key). `keyed` adds the stages of keys
 * with room (walked from cursor $4) and expired keyed leases; every row carries the cursor for
 * the next claim (and one row with a null id carries it when nothing was found).
 */
export const pickCandidatesSql = (limit: number, hashes: number, keyed: boolean, by: ClaimOrder = 'priority'): string => {
  check(limit, hashes);
  const kinds = ['queued', 'expired', ...(keyed ? ['keyed'] : [])];
  const walk = keyed
    ? keyedCandidates(limit, by)
    : `
walk(k, visited) AS (SELECT $4::text, 0)`; // no keys walked: the cursor stays
  const lastVisited = '(SELECT w.k FROM walk w WHERE w.visited > 0 ORDER BY w.visited DESC LIMIT 1)';
  // By priority the walk visits every key it can: the next claim goes on after the last key it took from (keys of one
  // priority take turns, x.vis above), or after the last one visited when it took from none.
  const cursor =
    keyed && by === 'priority'
      ? `coalesce((SELECT w.k FROM walk w WHERE w.visited > 0 AND w.k IN (SELECT concurrency_key FROM keyed)
    ORDER BY w.visited DESC LIMIT 1), ${lastVisited})`
      : lastVisited;
  return `
WITH RECURSIVE clk AS MATERIALIZED (SELECT ${DB_NOW_EXPR} AS t),${candidates(hashes, limit, keyed, 'own', by)},${walk},
picked AS (${kinds.map((k) => `SELECT id, concurrency_key, concurrency_limit, ${k === 'expired' ? 0 : 1} AS rk, pr, at FROM ${k}`).join(' UNION ALL ')})
SELECT p.id::text AS id, p.concurrency_key, p.concurrency_limit, $1::text AS owner,
  ${cursor} AS next_cursor
FROM (SELECT 1) one LEFT JOIN picked p ON true
ORDER BY p.rk, p.pr DESC NULLS LAST, p.at, p.id`;
};

/**
 * The limited claim, last step: claim the stages $2 (ids this transaction already locked) for owner $1.
 * The lease starts at this statement's clock (ratchet.db_clock_now(): clock_timestamp() plus the
 * movable offset), not at the transaction's start (db_now() is now()): the transaction may have
 * waited on the class and key locks, and a lease dated from before that wait would be short by it.
 */
export const CLAIM_IDS_SQL = `
WITH RECURSIVE clk AS MATERIALIZED (SELECT ratchet.db_clock_now() AS t),
picked AS (
  SELECT s.id, s.state AS prev_state, s.owner_id AS prev_owner, s.fence AS prev_fence
  FROM ratchet.stages s, clk
  WHERE s.id = ANY($2::bigint[])
    AND ((s.state = 'queued' AND s.available_at <= clk.t) OR (s.state = 'running' AND s.lease_until < clk.t))
    AND ${RUN_IS_ACTIVE}
),${claimPicked()}`;

/**
 * A claim that names no definitions (tools and tests, never a worker) takes any: the hashes of
 * the class's waiting stages ($1). Not a hot statement.
 */
export const WAITING_DEFINITIONS_SQL = `
SELECT DISTINCT definition_hash FROM ratchet.stages WHERE tool_class = $1 AND state IN ('queued', 'running') LIMIT ${MAX_CLAIM_DEFINITIONS}`;

/** Serialises the limited claims of one class ($1): transaction-scoped advisory lock. */
export const LOCK_CLASS_SQL = `SELECT pg_advisory_xact_lock(hashtextextended('ratchet:class:' || $1, 0))`;

/**
 * Waits for the locks of keys $1 (sorted, so two claimers never wait on each other in a cycle): only
 * at the start of a limited claim made again for keys found held, before the class lock and before
 * any candidate row is locked, and for at most the lock_timeout that transaction sets (claim.ts,
 * contendedKeyWait). No claimer waits on a key lock while it holds the class lock or candidate rows.
 */
export const LOCK_KEYS_SQL = `SELECT pg_advisory_xact_lock(hashtextextended('ratchet:key:' || k, 0)) FROM unnest($1::text[]) AS u(k)`;

/**
 * Serialises claims touching concurrency keys $1: takes each key's transaction-scoped advisory
 * lock if it is free and returns the keys it got. Never waits: the limited claim holds the class
 * lock and its candidate rows (FOR UPDATE SKIP LOCKED) by now, and a claim waiting on a key behind
 * another claimer would hide those rows, expired leases among them, from every other claimer
 * meanwhile (README, "Reclaim after a kill": 2.2 s). A claimer whose link to PostgreSQL was cut
 * mid-claim holds its keys, idle in its transaction, until that connection is reset (no
 * statement of its is running, so no statement time limit ends it). A key held elsewhere is
 * skipped; claim.ts makes the claim again for it.
 */
export const TRY_LOCK_KEYS_SQL = `SELECT k AS key FROM unnest($1::text[]) AS u(k) WHERE pg_try_advisory_xact_lock(hashtextextended('ratchet:key:' || k, 0))`;

/** Live leases of class $1 (running, lease not expired) by the database clock. */
export const COUNT_RUNNING_CLASS_SQL = `
SELECT count(*)::int AS n FROM ratchet.stages
WHERE state = 'running' AND tool_class = $1 AND lease_until >= ratchet.db_now()`;

/** Live leases per concurrency key in $1. */
export const COUNT_RUNNING_KEYS_SQL = `
SELECT concurrency_key AS key, count(*)::int AS n FROM ratchet.stages
WHERE state = 'running' AND concurrency_key = ANY($1::text[]) AND lease_until >= ratchet.db_now()
GROUP BY concurrency_key`;

/**
 * Claims of class $1 started in the last $2 ms (the rate limit's sliding window); prunes older ones.
 * By the statement clock (db_clock_now), as the claim dates its leases and events (CLAIM_IDS_SQL) and
 * RECORD_RATE_SQL dates its record: by the transaction's start (db_now), a claim that waited for the
 * class lock counted an older window than the one its claims fell in (6 claims in 1 s seen under load
 * in test/faults/limits.test.ts).
 */
export const COUNT_RATE_SQL = `
WITH pruned AS (DELETE FROM ratchet.rate_claims WHERE tool_class = $1 AND at < ratchet.db_clock_now() - $2::int * interval '1 millisecond')
SELECT count(*)::int AS n FROM ratchet.rate_claims WHERE tool_class = $1 AND at >= ratchet.db_clock_now() - $2::int * interval '1 millisecond'`;

/** Records $2 claims of class $1 now (the statement clock, after the claim), for the rate limit's window. */
export const RECORD_RATE_SQL = `INSERT INTO ratchet.rate_claims (tool_class, at) SELECT $1, ratchet.db_clock_now() FROM generate_series(1, $2::int)`;
