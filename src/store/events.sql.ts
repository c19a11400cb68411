/**
 * Append events written outside a lease statement (tool_request_started, ownership_unknown,
 * ...): $1 is a JSON array of { runId, stageId?, type, fence?, attempt?, at?, data? }.
 * `at` is when it happened on this process's wall clock (it may be written much later,
 * once the database answers again).
 * A tool_request_started event that carries the key the tool derived (data.effectKey) also
 * records it on its stage — only while the stage still has that event's token — so what was
 * sent is on the stage from the moment the effect starts, even if the attempt never finishes.
 */
export const APPEND_EVENTS_SQL = `
WITH ev AS (
  SELECT * FROM jsonb_to_recordset($1::jsonb)
    AS e("runId" uuid, "stageId" bigint, type text, fence bigint, attempt int, at timestamptz, data jsonb)
),
effect_key AS (
  UPDATE ratchet.stages s SET effect_key = k.key
  FROM (SELECT DISTINCT ON ("stageId") "stageId" AS id, fence, data->>'effectKey' AS key FROM ev
        WHERE type = 'tool_request_started' AND data ? 'effectKey' ORDER BY "stageId", at DESC) k
  WHERE s.id = k.id AND s.fence = k.fence
  RETURNING s.id
)
INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
SELECT e."runId", e."stageId", e.type, e.fence, e.attempt, coalesce(e.at, ratchet.db_now()), e.data FROM ev e`;

/** Did an attempt of stage $2 (run $1) before fence $3 begin an irreversible request? */
export const EFFECT_STARTED_SQL = `
SELECT EXISTS (
  SELECT 1 FROM ratchet.events
  WHERE run_id = $1::uuid AND stage_id = $2::bigint AND type = 'tool_request_started' AND fence < $3::bigint
) AS started`;

/** Outputs of run $1's succeeded stages by step name (to compute a next step's input). */
export const STAGE_RESULTS_SQL = `
SELECT name, result FROM ratchet.stages WHERE run_id = $1::uuid AND state = 'succeeded' ORDER BY seq`;

/** Run $1's stages in order with their results (an agent rebuilds its conversation from them). */
export const RUN_STAGES_SQL = `
SELECT seq, name, tool, state, result FROM ratchet.stages WHERE run_id = $1::uuid ORDER BY seq`;
