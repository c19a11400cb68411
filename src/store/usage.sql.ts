/**
 * A run's usage ($1 run id): the sum over its model stages' finish events that carry `usage` — succeeded, and also
 * failed or retried after the model answered (a call's tokens are spent whatever the stage then decides); cost NULL
 * when none was priced. A call whose finish was refused (fenced out), or that answered after its attempt was over,
 * is in the Prometheus counters only.
 */
export const RUN_USAGE_SQL = `
SELECT coalesce(sum((data->'usage'->>'inputTokens')::bigint), 0)::text AS input_tokens,
  coalesce(sum((data->'usage'->>'outputTokens')::bigint), 0)::text AS output_tokens,
  sum((data->'usage'->>'cost')::numeric)::text AS cost,
  count(*)::int AS model_calls
FROM ratchet.events WHERE run_id = $1::uuid AND type IN ('stage_succeeded', 'stage_failed', 'retry_scheduled') AND data ? 'usage'`;
