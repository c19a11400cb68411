import { sourcesOf } from '../planner/states.js';
import type { Queryable } from './db.js';

/**
 * ============================== SEAM (phase 2 of issue 10) ==============================
 * A wait that ends outside a worker (a signal delivered, an approval refused, a timeout) must
 * "queue what follows in the same transaction", as a finish does. After the run graph (graph2)
 * merges, that is its settle fragment (`settleFrom(source)` in lease-common.sql.ts: the join
 * counters, the sinks, the group failure, the parent wake-up): the lead replaces the body of
 * `settleEnded` with it, one source row per ended stage (value = output, or the failure as a
 * value for an agent's refused call; fails_run for a static refusal). The contract callers rely
 * on stays: called inside the caller's transaction, after the stage row was moved to its
 * terminal state under its row lock; returns the stages it queued (to notify the transport)
 * and the run's end, if it ended.
 *
 * Until then: today's linear rule (every run is a chain by seq, as finish.sql.ts's next_stage):
 * the next stage (seq + 1) goes pending -> queued; no next stage ends the run with the output;
 * a failure that fails the run cancels every stage of it that has not ended.
 * =========================================================================================
 */
export interface EndedStage {
  stageId: string;
  runId: string;
  seq: number;
  outcome: 'succeeded' | 'failed';
  /** The output (succeeded), or the failure as the agent's next model call reads it (failed, asValue). */
  value?: unknown;
  error?: unknown;
  /** A failure kept as a value (an agent's refused call; continueOnError): what follows goes on. */
  asValue?: boolean;
}

export interface Settled {
  /** Stages this settled made due, with the attempt their next claim creates (the transport's job id). */
  queued: { id: string; toolClass: string; definitionHash: string; attempt: number }[];
  runEnded: 'succeeded' | 'failed' | null;
}

const STAGE_UNFINISHED = sourcesOf('stage', 'cancelled');

export async function settleEnded(tx: Queryable, s: EndedStage): Promise<Settled> {
  if (s.outcome === 'failed' && !s.asValue) {
    const runs = await tx.query(
      `UPDATE ratchet.runs SET state = 'failed', error = $2::jsonb, finished_at = ratchet.db_now(), updated_at = ratchet.db_now()
       WHERE id = $1::uuid AND state IN ('queued', 'running') RETURNING id`,
      [s.runId, JSON.stringify(s.error ?? null)],
    );
    const rest = await tx.query(
      `UPDATE ratchet.stages SET state = 'cancelled', finished_at = ratchet.db_now(), updated_at = ratchet.db_now()
       WHERE run_id = $1::uuid AND id <> $2::bigint AND state = ANY($3::text[]) RETURNING id::text, fence::text, attempt`,
      [s.runId, s.stageId, STAGE_UNFINISHED],
    );
    await tx.query(
      `INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data)
       SELECT $1::uuid, NULL, 'run_failed', NULL, NULL, ratchet.db_now(), jsonb_build_object('error', $2::jsonb) WHERE $3::boolean
       UNION ALL
       SELECT $1::uuid, x.id, 'stage_cancelled', x.fence, x.attempt, ratchet.db_now(), jsonb_build_object('reason', 'sibling_failed')
       FROM unnest($4::bigint[], $5::bigint[], $6::int[]) AS x(id, fence, attempt)`,
      [
        s.runId,
        JSON.stringify(s.error ?? null),
        runs.length > 0,
        rest.map((r) => r.id),
        rest.map((r) => r.fence ?? null),
        rest.map((r) => r.attempt ?? 0),
      ],
    );
    return { queued: [], runEnded: runs.length > 0 ? 'failed' : null };
  }
  const next = await tx.query(
    `UPDATE ratchet.stages SET state = 'queued', available_at = ratchet.db_now(), updated_at = ratchet.db_now()
     WHERE run_id = $1::uuid AND seq = $2::int + 1 AND state = 'pending'
     RETURNING id::text, tool_class, definition_hash, attempt`,
    [s.runId, s.seq],
  );
  if (next.length > 0) {
    return {
      queued: next.map((r) => ({
        id: r.id as string,
        toolClass: r.tool_class as string,
        definitionHash: r.definition_hash as string,
        attempt: (r.attempt as number) + 1,
      })),
      runEnded: null,
    };
  }
  const later = await tx.query(`SELECT 1 FROM ratchet.stages WHERE run_id = $1::uuid AND seq > $2::int LIMIT 1`, [s.runId, s.seq]);
  if (later.length > 0) return { queued: [], runEnded: null };
  const done = await tx.query(
    `UPDATE ratchet.runs SET state = 'succeeded', result = $2::jsonb, finished_at = ratchet.db_now(), updated_at = ratchet.db_now()
     WHERE id = $1::uuid AND state IN ('queued', 'running') RETURNING id`,
    [s.runId, JSON.stringify(s.value ?? null)],
  );
  if (done.length > 0) {
    await tx.query(`INSERT INTO ratchet.events (run_id, type, at, data) VALUES ($1::uuid, 'run_succeeded', ratchet.db_now(), NULL)`, [
      s.runId,
    ]);
  }
  return { queued: [], runEnded: done.length > 0 ? 'succeeded' : null };
}
