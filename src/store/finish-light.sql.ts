import {
  BY_ID_RUNNING,
  DB_NOW_EXPR,
  NEXT_NAMES,
  RUN_ACTIVE,
  STAGE_UNENDED,
  settleClaimedEvents,
  settleJoinFrom,
} from './lease-common.sql.js';

/**
 * The light finish (issue 14, PERF-NOTES §12): the plain rows of FINISH_SQL (finish.sql.ts), and only
 * those, in a statement of ~12 CTEs instead of ~40, so that planning it and starting its executor cost
 * a fraction of the full one's (PERF-NOTES §9: ~30% of PostgreSQL's CPU on the fast path).
 *
 * Same parameters as FINISH_SQL: $1 the owner, $2 the rows (JSON), $3 their ids. finish.ts sends here
 * only batches whose every row LOOKS plain (lightRow): a success, no retry, no failure, no wait, no
 * plan, no child run, no failed next stage, at most an explicit successful run end without a next
 * stage. Here each row is TAKEN only when the database proves it plain too:
 *   - the fence (FINISH_SQL's `accepted`: running, this owner, this token, lease not past), and
 *   - its run has no other row in this batch (so no row's outcome depends on another's: FINISH_SQL's
 *     `done` leaves out every row of a run another row ends explicitly), and
 *   - without a run end: the stage has no sink (FINISH_SQL would count down the run's sinks and could
 *     end the run and wake a parent: not done here);
 *   - with a run end (runState 'succeeded', no next stage): the run is active and no child run
 *     (parent_stage_id IS NULL: FINISH_SQL would wake its parent), and no other stage of the run is
 *     unended (FINISH_SQL would cancel it: rest_cancelled, its waits).
 * A taken row gets exactly FINISH_SQL's writes for it: the stage row (the same columns to the same
 * values), the successor's join and fast-path claim (settleJoinFrom, the text FINISH_SQL's settle
 * uses), the run's end (run_ended's UPDATE), and the same events with the same payloads in the same
 * order (stage_succeeded, job_claimed, run_succeeded) from one INSERT (one firing of the statement
 * trigger events_notify). Every other row is left untouched (no result_rejected, no replay look-up) and
 * answered `taken = false`: finish.ts sends those, and only those, through FINISH_SQL, which decides
 * them as it always did (a refused fence, a replay, a sink, a child run's end...).
 */
export const FINISH_LIGHT_SQL = `
WITH RECURSIVE clk AS MATERIALIZED (SELECT ${DB_NOW_EXPR} AS t),
req AS (
  SELECT * FROM jsonb_to_recordset($2::jsonb) AS r(id bigint, fence bigint, outcome text, result jsonb, error jsonb,
    "nextSeq" int, "nextInput" jsonb, "claimNext" boolean, "runState" text, "runResult" jsonb, "runError" jsonb, "effectKey" text,
    data jsonb, "retryDelayMs" int, "asValue" boolean, "waitFor" int, "nextError" jsonb, plan jsonb, child jsonb)
),
-- Runs with more than one row in this batch: none of their rows is taken here.
shared_runs AS MATERIALIZED (
  SELECT s.run_id FROM ratchet.stages s WHERE s.id = ANY($3::bigint[]) GROUP BY s.run_id HAVING count(*) > 1
),
accepted AS (
  UPDATE ratchet.stages s SET
    state = 'succeeded',
    result = req.result,
    error = coalesce(req.error, s.error),
    effect_key = coalesce(req."effectKey", s.effect_key),
    finished_at = clk.t,
    updated_at = clk.t
  FROM req, clk
  WHERE s.id = ANY($3::bigint[]) AND s.id = req.id AND s.fence = req.fence AND s.owner_id = $1 AND s.state = ${BY_ID_RUNNING}
    AND s.lease_until > clk.t
    AND req.outcome = 'succeeded' AND req."retryDelayMs" IS NULL AND req."asValue" IS NULL AND req."waitFor" IS NULL
    AND req."nextError" IS NULL AND req.plan IS NULL AND req.child IS NULL
    AND s.run_id <> ALL (ARRAY(SELECT run_id FROM shared_runs))
    AND CASE WHEN req."runState" IS NULL THEN s.sink IS NULL
      ELSE req."runState" = 'succeeded' AND req."nextSeq" IS NULL
        AND EXISTS (SELECT 1 FROM ratchet.runs r WHERE r.id = s.run_id AND r.state IN (${RUN_ACTIVE}) AND r.parent_stage_id IS NULL)
        AND NOT EXISTS (SELECT 1 FROM ratchet.stages o WHERE o.run_id = s.run_id AND o.state IN (${STAGE_UNENDED}) AND o.id <> s.id)
      END
  RETURNING s.id, s.run_id, s.fence, s.attempt, s.next_seqs, s.sink, coalesce(s.step, s.name) AS step, req.result,
    req."nextSeq" AS next_seq, req."nextInput" AS next_input, coalesce(req."claimNext", false) AS claim_next,
    req."runState" AS run_state, req."runResult" AS run_result, req."runError" AS run_error, req.data
),
-- FINISH_SQL's done: a success counts for the join unless it ends its run (then it is the only row of its run here).
done AS (
  SELECT a.id, a.run_id, a.fence, a.next_seqs, a.next_seq, a.sink, a.step, a.result AS value, false AS skipped, a.claim_next, a.next_input
  FROM accepted a WHERE a.run_state IS NULL
),${settleJoinFrom('done', 'settle', '$1::text')},
run_ended AS (
  UPDATE ratchet.runs r SET state = f.run_state, result = f.run_result, error = f.run_error, finished_at = clk.t, updated_at = clk.t
  FROM accepted f, clk
  WHERE r.id = f.run_id AND f.run_state IS NOT NULL AND r.state IN (${RUN_ACTIVE})
  RETURNING r.id, r.state
),
ev AS (
  INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
  SELECT f.run_id, f.id, 'stage_succeeded', f.fence, f.attempt, clk.t, coalesce(f.data, '{}'::jsonb) || jsonb_build_object('owner', $1::text)
  FROM accepted f, clk
  UNION ALL
  ${settleClaimedEvents('settle')}
  UNION ALL
  SELECT d.id, NULL, 'run_' || d.state, NULL, NULL, clk.t, NULL FROM run_ended d, clk
),
handed AS MATERIALIZED (
  SELECT c.id::text AS id, c.run_id, c.seq, c.name, c.tool, c.tool_class, c.fence::text AS fence, c.attempt, c.max_attempts,
    c.input, c.idempotency_key, c.lease_ms, c.timeout_ms, c.max_duration_ms, c.first_claimed_at, c.error,
    r.workflow, r.definition_hash, r.input AS run_input, r.deadline AS run_deadline, r.traceparent AS run_traceparent, c.after_id
  FROM (SELECT ${NEXT_NAMES}, after_id FROM settle_joined WHERE state = 'running') c
  JOIN ratchet.runs r ON r.id = c.run_id
)
SELECT req.id::text AS id, (f.id IS NOT NULL) AS taken,
  (SELECT coalesce(jsonb_agg(jsonb_build_object('stageId', w.id::text, 'toolClass', w.tool_class, 'definitionHash', w.definition_hash) ORDER BY w.id), '[]'::jsonb)
     FROM settle_joined w WHERE w.after_id = req.id AND w.state = 'queued') AS woken,
  f.fence::text AS current_fence, clk.t AS db_now,
  CASE WHEN h.id IS NOT NULL THEN to_jsonb(h) - 'after_id' END AS next_claimed
FROM req CROSS JOIN clk
LEFT JOIN accepted f ON f.id = req.id
LEFT JOIN handed h ON h.after_id = req.id
ORDER BY req.id`;
