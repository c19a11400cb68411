import type { Queryable } from './db.js';
import { RUN_USAGE_SQL } from './usage.sql.js';

export interface RunUsage {
  inputTokens: number;
  outputTokens: number;
  modelCalls: number;
  /** The sum of the model stages' costs; absent when no model stage of the run had a price. */
  cost?: number;
}

/** A run's model usage, summed over its model stages' events (src/observability/model-usage.ts). */
export async function runUsage(q: Queryable, runId: string): Promise<RunUsage> {
  const [r] = await q.query(RUN_USAGE_SQL, [runId], 'ratchet_run_usage');
  return {
    inputTokens: Number(r?.input_tokens ?? 0),
    outputTokens: Number(r?.output_tokens ?? 0),
    modelCalls: Number(r?.model_calls ?? 0),
    ...(r?.cost !== null && r?.cost !== undefined ? { cost: Number(r.cost) } : {}),
  };
}
