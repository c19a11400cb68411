import { assertTransition, sourcesOf, sqlStates, WAIT_STAGE_STATES } from '../planner/states.js';

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
  ['waiting', 'cancelled'],
  ['awaiting_approval', 'cancelled'],
  ['running', 'cancelled'],
  ['waiting', 'queued'],
] as const)
  assertTransition('stage', from, to);
for (const [from, to] of [
  ['queued', 'running'],
  ['queued', 'failed'],
  ['running', 'failed'],
  ['running', 'succeeded'],
  ['running', 'expired'],
  ['running', 'cancelled'],
  ['queued', 'cancelled'],
] as const) {
  assertTransition('run', from, to);
}

export const RUN_ACTIVE = sqlStates(sourcesOf('run', 'failed').filter((s) => sourcesOf('run', 'succeeded').includes(s)));
/** The group failure (run graph): a failed run cancels every unended stage, parallel running ones included (they see `cancelled` at their next extend). */
export const STAGE_UNENDED = sqlStates(sourcesOf('stage', 'cancelled'));
/** The unended states whose cancel gets a stage_cancelled event (a worker or a person may be looking at them; pending/queued rows are many and silent). */
export const STAGE_CANCEL_EVENT = sqlStates(['running', ...WAIT_STAGE_STATES]);
export const STAGE_NOT_STARTED = sqlStates(['pending', 'queued'].filter((s) => sourcesOf('stage', 'cancelled').includes(s as 'pending')));

/**
 * CTE fragments that end a run as failed because of stage rows in `source` (a CTE with
 * run_id, state, error columns) whose state is 'failed': the run becomes failed with the
 * stage's error, and its unended stages are cancelled (running parallel ones too: the group failure),
 * awaiting approval included, with a stage_cancelled event (previous state, reason run_failed) for the
 * running, waiting and awaiting_approval ones, as the finish writes them; its child runs are cancelled,
 * recursively, with their stages (as the finish's `descendants`); the open waits (ratchet.waits: a
 * sleep, a signal, an approval) of every stage cancelled here end `cancelled` with a wait_ended event,
 * as CANCEL_RUN_SQL closes them. Same words everywhere. The statement must begin WITH RECURSIVE.
 * The stages of the failed runs are taken by run_id = ANY(ARRAY(...)), never by a join to the CTE: a hash
 * join read a Seq Scan of stages up to its first unended row before it found the CTE empty (finish.sql.ts).
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
${prefix}_rest_old AS (
  SELECT s.id, s.state FROM ratchet.stages s WHERE s.run_id = ANY(ARRAY(SELECT id FROM ${prefix}_run_failed)) AND s.state IN (${STAGE_UNENDED})
),
-- (the failing stage itself was updated by ${source} in this statement: this UPDATE skips it)
${prefix}_rest_cancelled AS (
  UPDATE ratchet.stages s SET state = 'cancelled', updated_at = clk.t, finished_at = clk.t
  FROM ${prefix}_rest_old o, clk
  WHERE s.id = o.id AND s.state IN (${STAGE_UNENDED})
  RETURNING s.id, s.run_id, s.fence, s.attempt, o.state AS old_state
),
-- The failed run's child runs, recursively, cancelled with their stages.
${prefix}_descendants(id) AS (
  SELECT c.id FROM ratchet.runs c JOIN ${prefix}_run_failed f ON c.parent_run_id = f.id
  UNION ALL
  SELECT c.id FROM ratchet.runs c JOIN ${prefix}_descendants t ON c.parent_run_id = t.id
),
${prefix}_children_cancelled AS (
  UPDATE ratchet.runs r SET state = 'cancelled', finished_at = clk.t, updated_at = clk.t,
    error = jsonb_build_object('code', 'cancelled', 'message', 'its parent run ended')
  FROM ${prefix}_descendants t, clk WHERE r.id = t.id AND r.state IN (${RUN_ACTIVE})
  RETURNING r.id
),
${prefix}_children_stages_cancelled AS (
  UPDATE ratchet.stages s SET state = 'cancelled', finished_at = clk.t, updated_at = clk.t
  FROM clk WHERE s.run_id = ANY(ARRAY(SELECT id FROM ${prefix}_children_cancelled)) AND s.state IN (${STAGE_UNENDED})
  RETURNING s.id
),
-- The open waits of the stages cancelled here end 'cancelled' (an approval without a timeout would otherwise stay open for good).
${prefix}_waits_closed AS (
  ${closeWaitsOf(`(SELECT id FROM ${prefix}_rest_cancelled UNION ALL SELECT id FROM ${prefix}_children_stages_cancelled) c`, "'cancelled'")}
),
${prefix}_run_failed_ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT f.id, NULL, 'run_failed', NULL, NULL, clk.t, NULL FROM ${prefix}_run_failed f, clk
  UNION ALL
  SELECT c.run_id, c.id, 'stage_cancelled', c.fence, c.attempt, clk.t, jsonb_build_object('previousState', c.old_state, 'reason', 'run_failed')
  FROM ${prefix}_rest_cancelled c, clk WHERE c.old_state IN (${STAGE_CANCEL_EVENT})
  UNION ALL
  SELECT c.id, NULL, 'run_cancelled', NULL, NULL, clk.t, jsonb_build_object('reason', 'parent_ended') FROM ${prefix}_children_cancelled c, clk
  UNION ALL
  SELECT w.run_id, w.stage_id, 'wait_ended', NULL, NULL, clk.t, jsonb_build_object('kind', w.kind, 'outcome', 'cancelled')
  FROM ${prefix}_waits_closed w, clk
)`;
}

/**
 * The body of ratchet.db_now() (drizzle/0001_clock_functions.sql: now() plus the movable offset), for the
 * `clk` CTE of the hot statements (finish, claim, extend, release). A SQL function whose body has a
 * sub-select is never inlined: each call ran as a query of its own, planned again at every statement
 * (one plan per claim or finish batch). Inlined, the sub-select is planned once with the statement's
 * generic plan. test/store/db-now-inline.test.ts checks it gives what the function gives, offset included.
 */
export const DB_NOW_EXPR = `(now() + coalesce((SELECT c.offset_ms FROM ratchet.clock c WHERE c.id = 1), 0) * interval '1 millisecond')`;

/**
 * 'running' as the fence's UPDATEs compare it (`s.state = ${BY_ID_RUNNING}`) where they take stages by their
 * ids (a bigint[] parameter, the primary key): an initplan, whose value the planner does not see. Against
 * the literal it can prove stages_running_lease_idx's predicate and take the lease check
 * (`lease_until > clk.t`) as that index's condition: a bitmap scan of every live lease of every worker (and
 * of their dead entries until a vacuum) for each batch, which its row estimate (the running rows of the
 * last ANALYZE, few) made look cheaper than the primary-key probes. In the fast-path bench it was the
 * generic plan of the finish, 18% of PostgreSQL's CPU (PERF-NOTES §9). The value is the same, so the
 * fence (and its re-check on a concurrently updated row) is unchanged.
 */
export const BY_ID_RUNNING = `(SELECT 'running'::text)`;

/** The columns of a next stage handed to its owner on the fast path (finish's joined and next_handed_again return the same). */
export const NEXT_COLUMNS = `s.id, s.run_id, s.seq, s.name, s.tool, s.tool_class, s.state, s.owner_id, s.fence, s.attempt,
    s.max_attempts, s.input, s.idempotency_key, s.lease_until, s.lease_ms, s.timeout_ms,
    s.max_duration_ms, s.claimed_at, s.first_claimed_at, s.error, 'queued'::text AS prev_state, NULL::bigint AS prev_fence`;
/** The names of NEXT_COLUMNS, to select them again from the CTE that returned them (finish's `handed`). */
export const NEXT_NAMES = `id, run_id, seq, name, tool, tool_class, state, owner_id, fence, attempt, max_attempts, input, idempotency_key,
    lease_until, lease_ms, timeout_ms, max_duration_ms, claimed_at, first_claimed_at, error, prev_state, prev_fence`;

/**
 * The settle fragment of the run graph: what happens when stages count as DONE (succeeded, skipped,
 * or failed as a value: continueOnError, an agent's tool error told to the model). Used by
 * FINISH_SQL (source `done`), claim/extend (continue_on_error stages whose attempts or time ran out)
 * and the waits (waits-settle.ts). The statement must begin `WITH RECURSIVE clk AS MATERIALIZED
 * (SELECT ratchet.db_now() AS t)` (or any `clk(t)`), and the source stage rows must already be
 * moved to their terminal state by an earlier CTE of the same statement (or an earlier statement of
 * the same transaction).
 *
 * `source` names a CTE with EXACTLY these columns, one row per stage that counts as done:
 *   id          bigint   the stage that ended (the `by_id` of what it queued: the caller's wake-up list)
 *   run_id      uuid     its run
 *   fence       bigint   its token (only recorded in the fast path's job_claimed event; NULL is fine)
 *   next_seqs   int[]    its successors (stages.next_seqs)
 *   next_seq    int      NULL, or for a row of the previous release (next_seqs '{}'), its successor's seq
 *   sink        text     stages.sink: NULL, 'only' (the run's result is its value) or 'one_of' (result[step])
 *   step        text     coalesce(stages.step, stages.name): the key of a 'one_of' sink's value
 *   value       jsonb    the result it gives: the output; `{ok:false, error}` for a failure kept as a value; NULL when skipped
 *   skipped     boolean  true for a skip (a skipped 'one_of' sink adds no key to the run's result)
 *   claim_next  boolean  the fast path: claim the successor for `owner` (only when one source row alone
 *                        feeds it, it is unkeyed and no due stage of higher priority waits); false outside a finish
 *   next_input  jsonb    NULL, or the successor's input computed by its finisher (fast path, linear successor)
 *
 * CTEs it adds, named `${prefix}_...`:
 *   _dec, _dec_claim  one row per successor (k = how many source rows feed it; a writable CTE cannot update a row twice)
 *   _joined        the successors' counters dropped under their row lock: the one that reaches 0 is
 *                  queued (exactly once, EvalPlanQual) or claimed for `owner` (state 'running');
 *                  RETURNS NEXT_COLUMNS, deps_left, definition_hash, after_id (source id), after_fence
 *   _sink_done, _run_done  the run's sink counter; the run succeeds when it reaches 0 (its result
 *                  accumulated in the runs UPDATE); _run_done RETURNS id, state, parent_stage_id, by_id
 *   _parent_woken  a run that succeeded here wakes its parent's waiting child-run stage (queued);
 *                  RETURNS id, run_id, tool_class, definition_hash, by_id
 *   _events        rows (run_id, stage_id, type, fence, attempt, at, data) the CALLER inserts into
 *                  ratchet.events (job_claimed for a fast-path claim, run_succeeded): a plain SELECT,
 *                  so the caller orders its events as it likes.
 * Stages to wake (notify the transport): `_joined WHERE state = 'queued'` and `_parent_woken`.
 * `owner` is an SQL expression for the fast path's owner (finish: '$1'); NULL::text without a fast path.
 */
export function settleFrom(source: string, prefix: string, owner = 'NULL::text'): string {
  const p = prefix;
  return `${settleJoinFrom(source, prefix, owner)},
-- The run's own counter: the sinks that ended here, their values accumulated in the runs row's
-- UPDATE (re-evaluated on the newest version of the row, so two sinks finishing at once both land;
-- never a SELECT of other sinks: its snapshot may predate their commit).
${p}_sink_done AS (
  SELECT run_id, count(*)::int AS k, min(id) AS by_id, bool_or(sink = 'only') AS only,
    (array_agg(value) FILTER (WHERE sink = 'only'))[1] AS only_value,
    coalesce(jsonb_object_agg(step, value) FILTER (WHERE sink = 'one_of' AND NOT coalesce(skipped, false)), '{}'::jsonb) AS part
  FROM ${source} WHERE sink IS NOT NULL GROUP BY run_id
),
${p}_run_done AS (
  UPDATE ratchet.runs r SET sinks_left = r.sinks_left - k.k,
    result = CASE WHEN k.only THEN k.only_value ELSE coalesce(r.result, '{}'::jsonb) || k.part END,
    state = CASE WHEN r.sinks_left - k.k <= 0 THEN 'succeeded' ELSE r.state END,
    finished_at = CASE WHEN r.sinks_left - k.k <= 0 THEN clk.t ELSE r.finished_at END, updated_at = clk.t
  FROM ${p}_sink_done k, clk
  WHERE r.id = k.run_id AND r.state IN (${RUN_ACTIVE}) AND r.sinks_left IS NOT NULL
  RETURNING r.id, r.state, r.parent_stage_id, k.by_id
),
-- A run that succeeded here wakes the stage of its parent that started it (waiting without a
-- lease): claimed again, that stage takes the child's result.
${p}_parent_woken AS (
  UPDATE ratchet.stages ps SET state = 'queued', deps_left = 0, available_at = clk.t, updated_at = clk.t
  FROM ${p}_run_done e, clk
  WHERE ps.id = e.parent_stage_id AND e.state = 'succeeded' AND ps.state = 'waiting'
  RETURNING ps.id, ps.run_id, ps.tool_class, ps.definition_hash, e.by_id
),
${p}_events AS (
  ${settleClaimedEvents(p)}
  UNION ALL
  SELECT d.id, NULL::bigint, 'run_succeeded', NULL::bigint, NULL::int, clk.t, NULL::jsonb FROM ${p}_run_done d, clk WHERE d.state = 'succeeded'
)`;
}

/**
 * The first part of settleFrom (its CTEs ${prefix}_dec, _dec_claim, _joined, see there): the successors'
 * counters and the fast path's claim, without the run's sink counter. settleFrom is this plus the rest;
 * the light finish (finish-light.sql.ts) takes only this, for stages without a sink.
 */
export function settleJoinFrom(source: string, prefix: string, owner = 'NULL::text'): string {
  const p = prefix;
  const claimNow = `s.deps_left - d.k <= 0 AND d.may_claim AND s.state = 'pending'`;
  return `
-- One row per successor, however many rows of ${source} feed it. The fast path: one row alone feeds
-- it, asked to claim it, and it is unkeyed (a keyed one must pass the limited claim) with no due
-- stage of higher priority of its class and definition waiting (README "Priorities").
${p}_dec AS (
  SELECT d.run_id, n.seq, count(*)::int AS k, min(d.id) AS by_id, min(d.fence) AS by_fence,
    (count(*) = 1 AND bool_and(coalesce(d.claim_next, false))) AS claim,
    (array_agg(d.next_input) FILTER (WHERE d.next_input IS NOT NULL))[1] AS next_input
  -- (a row written by an older release after the upgrade has no next_seqs: its finisher's nextSeq stands in)
  FROM ${source} d CROSS JOIN LATERAL unnest(CASE WHEN cardinality(d.next_seqs) = 0 AND d.next_seq IS NOT NULL
    THEN ARRAY[d.next_seq] ELSE d.next_seqs END) AS n(seq)
  GROUP BY d.run_id, n.seq
),
-- The priority probe is an ordered LIMIT 1 over stages_queued_priority_idx (tool_class, definition_hash,
-- priority DESC, ...): it reads only entries of a higher priority (none, usually). As EXISTS the planner
-- took a Seq Scan of the whole table per row (PERF-NOTES §4). MATERIALIZED: may_claim is read by every
-- CASE of _joined below, and an inlined CTE copied the probe into each of them (8 sub-plans per row).
${p}_dec_claim AS MATERIALIZED (
  SELECT dec.*, (${owner} IS NOT NULL AND dec.claim AND s.concurrency_key IS NULL AND (
      SELECT 1 FROM ratchet.stages q WHERE q.state = 'queued' AND q.concurrency_key IS NULL AND q.tool_class = s.tool_class
        AND q.definition_hash = s.definition_hash AND q.priority > s.priority AND q.available_at <= clk.t
      ORDER BY q.priority DESC LIMIT 1) IS NULL) AS may_claim
  FROM ${p}_dec dec JOIN ratchet.stages s ON s.run_id = dec.run_id AND s.seq = dec.seq CROSS JOIN clk
),
-- The join, under each successor's row lock (a statement waiting on it re-evaluates on the committed
-- version, so exactly one sees the counter reach 0).
${p}_joined AS (
  UPDATE ratchet.stages s SET
    deps_left = greatest(s.deps_left - d.k, 0),
    state = CASE WHEN s.deps_left - d.k > 0 THEN s.state WHEN d.may_claim AND s.state = 'pending' THEN 'running' ELSE 'queued' END,
    input = CASE WHEN s.deps_left - d.k <= 0 AND d.next_input IS NOT NULL THEN d.next_input ELSE s.input END,
    available_at = CASE WHEN s.deps_left - d.k <= 0 THEN clk.t ELSE s.available_at END,
    owner_id = CASE WHEN ${claimNow} THEN ${owner} ELSE s.owner_id END,
    fence = CASE WHEN ${claimNow} THEN nextval('ratchet.fence_seq') ELSE s.fence END,
    attempt = CASE WHEN ${claimNow} THEN s.attempt + 1 ELSE s.attempt END,
    lease_until = CASE WHEN ${claimNow} THEN clk.t + s.lease_ms * interval '1 millisecond' ELSE s.lease_until END,
    heartbeat_at = CASE WHEN ${claimNow} THEN clk.t ELSE s.heartbeat_at END,
    claimed_at = CASE WHEN ${claimNow} THEN clk.t ELSE s.claimed_at END,
    first_claimed_at = CASE WHEN ${claimNow} THEN coalesce(s.first_claimed_at, clk.t) ELSE s.first_claimed_at END,
    updated_at = clk.t
  FROM ${p}_dec_claim d, clk
  WHERE s.run_id = d.run_id AND s.seq = d.seq AND s.state IN ('pending', 'waiting')
  RETURNING ${NEXT_COLUMNS}, s.deps_left, s.definition_hash, d.by_id AS after_id, d.by_fence AS after_fence
)`;
}

/** The job_claimed events of settleJoinFrom's fast-path claims (as settleFrom's _events writes them). */
export function settleClaimedEvents(prefix: string): string {
  return `SELECT n.run_id, n.id AS stage_id, 'job_claimed'::text AS type, n.fence, n.attempt, clk.t AS at,
    jsonb_build_object('owner', n.owner_id, 'leaseUntil', n.lease_until, 'fastPath', true, 'byStage', n.after_id::text,
      'byFence', n.after_fence::text) AS data
  FROM ${prefix}_joined n, clk WHERE n.state = 'running'`;
}

/**
 * The settleFrom source (its columns, see there) of the rows of `from` (id, run_id, state, fence,
 * error, continue_on_error, next_seqs, sink, step) that failed for good with continue_on_error: the
 * failure kept as a value (`{ ok: false, error }`, the asValue mark left out) for what follows.
 * The claim (attempts_exhausted) and the extend (stage_duration_exceeded) use it; their rows
 * without continue_on_error go to failRunsFrom instead.
 */
export function failedAsValue(from: string, name: string): string {
  return `
${name} AS (
  SELECT f.id, f.run_id, f.fence, f.next_seqs, NULL::int AS next_seq, f.sink, f.step,
    jsonb_build_object('ok', false, 'error', f.error - 'asValue') AS value, false AS skipped, false AS claim_next, NULL::jsonb AS next_input
  FROM ${from} f WHERE f.state = 'failed' AND f.continue_on_error
)`;
}

/** What every claim returns per row (c: the claimed stage, r: its run). */
export const CLAIMED_COLUMNS = `c.id::text AS id, c.run_id, c.seq, c.name, c.tool, c.tool_class, c.state, c.fence::text AS fence,
  c.attempt, c.max_attempts, c.input, c.idempotency_key, c.lease_until, c.lease_ms,
  c.timeout_ms, c.max_duration_ms, c.claimed_at, c.first_claimed_at, c.error, c.prev_state, c.prev_fence::text AS prev_fence, clk.t AS db_now,
  r.workflow, r.definition_hash, r.input AS run_input, r.deadline AS run_deadline, r.traceparent AS run_traceparent`;

/**
 * The body of a CTE that ends the open waits (ratchet.waits, issue 10) of the stages a statement just
 * cancelled or expired: `stageIds` is a FROM item with an `id` column, `outcome` a SQL expression.
 * One place for every statement that ends stages without their wait's own decision (cancel, expiry,
 * group failure, leftovers).
 */
export function closeWaitsOf(stageIds: string, outcome: string): string {
  return `UPDATE ratchet.waits w SET ended_at = clk.t, outcome = ${outcome}
  FROM clk, ${stageIds} WHERE w.stage_id = c.id AND w.ended_at IS NULL
  RETURNING w.run_id, w.stage_id, w.kind, w.outcome`;
}
