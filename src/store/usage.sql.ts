/** A run's usage: the sum over its model stages' stage_succeeded events ($1 run id); cost NULL when none was priced. */
export const RUN_USAGE_SQL = `
SELECT coalesce(sum((data->'usage'->>'inputTokens')::bigint), 0)::text AS input_tokens,
  coalesce(sum((data->'usage'->>'outputTokens')::bigint), 0)::text AS output_tokens,
  sum((data->'usage'->>'cost')::numeric)::text AS cost,
  count(*) FILTER (WHERE data ? 'usage')::int AS model_calls
FROM ratchet.events WHERE run_id = $1::uuid AND type = 'stage_succeeded' AND data ? 'usage'`;
