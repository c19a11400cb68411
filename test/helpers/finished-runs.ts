import type { Queryable } from '../../src/store/index.js';

export interface RunFixture {
  count: number;
  /** The runs were created this long ago (plus i ms for the i-th), by the database clock. */
  createdAgoMs: number;
  /** Finished one minute after they were created; false: finished_at stays null (an unfinished run). */
  finished?: boolean;
  /** States, in turn (default the four finished ones). */
  states?: readonly string[];
  stagesPerRun?: number;
  eventsPerRun?: number;
  workflow?: string;
  toolClass?: string;
}

/**
 * Inserts runs straight with SQL (one statement: runs, their stages and their events), fast
 * enough for 100,000: retention tests and bench/prune.ts. Returns how many runs went in.
 */
export async function insertRuns(db: Queryable, f: RunFixture): Promise<number> {
  const [row] = await db.query(
    `
    WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
    r AS (
      INSERT INTO ratchet.runs (id, workflow, definition_hash, input, state, created_at, updated_at, finished_at)
      SELECT gen_random_uuid(), $2, 'fixture', '{}'::jsonb, ($3::text[])[1 + i % cardinality($3::text[])],
        clk.t - ($4::float8 + i) * interval '1 millisecond',
        clk.t - ($4::float8 + i) * interval '1 millisecond' + CASE WHEN $5::boolean THEN interval '1 minute' ELSE interval '0' END,
        CASE WHEN $5::boolean THEN clk.t - ($4::float8 + i) * interval '1 millisecond' + interval '1 minute' END
      FROM generate_series(1, $1::int) AS i, clk
      RETURNING id, state, created_at, finished_at
    ),
    s AS (
      INSERT INTO ratchet.stages (run_id, definition_hash, seq, name, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms, max_attempts,
        idempotency_key, input, available_at, created_at, updated_at, finished_at)
      SELECT r.id, 'fixture', n, 'step' || n, 'noop', $8, CASE WHEN $5::boolean THEN 'succeeded' ELSE 'queued' END, 30000, 30000, 600000, 3,
        r.id::text || ':' || n || ':noop', '{}'::jsonb, r.created_at, r.created_at, r.created_at, r.finished_at
      FROM r, generate_series(1, $6::int) AS n
    ),
    e AS (
      INSERT INTO ratchet.events (run_id, type, at, data)
      SELECT r.id, CASE WHEN n = 1 THEN 'run_submitted' ELSE 'fixture' END, r.created_at, jsonb_build_object('n', n)
      FROM r, generate_series(1, $7::int) AS n
    )
    SELECT count(*)::int AS n FROM r`,
    [
      f.count,
      f.workflow ?? 'fixture',
      f.states ?? ['succeeded', 'failed', 'cancelled', 'expired'],
      f.createdAgoMs,
      f.finished ?? true,
      f.stagesPerRun ?? 1,
      f.eventsPerRun ?? 3,
      f.toolClass ?? 'fixture',
    ],
  );
  return row!.n as number;
}

export const DAY_MS = 24 * 3600 * 1000;
