import type { Queryable } from '../../src/store/index.js';

export interface BulkStageOptions {
  leaseMs?: number;
  maxAttempts?: number;
  /** The runs' definition hash (default 'h'). */
  definitionHash?: string;
  /** A concurrency key and its limit for every stage (default none). */
  concurrencyKey?: string;
  concurrencyLimit?: number;
  /** The runs' and stages' priority (default 0). */
  priority?: number;
}

/**
 * Inserts `count` single-stage runs whose stage is queued and due, in one statement
 * (createRun one by one is too slow for thousands). Returns nothing; ids are sequential.
 */
export async function insertQueuedStages(db: Queryable, count: number, toolClass: string, opts: BulkStageOptions = {}): Promise<void> {
  await db.query(
    `
    WITH r AS (
      INSERT INTO ratchet.runs (id, workflow, definition_hash, input, state, priority)
      SELECT gen_random_uuid(), 'bulk', $5, '{}'::jsonb, 'queued', $8 FROM generate_series(1, $1::int)
      RETURNING id
    )
    INSERT INTO ratchet.stages (run_id, definition_hash, seq, name, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms, max_attempts,
      idempotency_key, input, available_at, concurrency_key, concurrency_limit, priority)
    SELECT r.id, $5, 1, 'noop', 'noop', $2, 'queued', $3, $3, 600000, $4, r.id::text || ':1:noop', '{}'::jsonb,
      ratchet.db_now() - interval '1 second', $6, $7, $8
    FROM r`,
    [
      count,
      toolClass,
      opts.leaseMs ?? 30_000,
      opts.maxAttempts ?? 3,
      opts.definitionHash ?? 'h',
      opts.concurrencyKey ?? null,
      opts.concurrencyLimit ?? null,
      opts.priority ?? 0,
    ],
  );
}
