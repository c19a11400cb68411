import type { Queryable } from './db.js';
import { failRunsFrom, RUN_ACTIVE, settleFrom } from './lease-common.sql.js';

/**
 * A wait that ends outside a worker (a signal delivered, an approval refused, a timeout) queues
 * what follows in the same transaction, exactly as a finish does: the run graph's settle
 * fragment (`settleFrom`, lease-common.sql.ts) over one source row — the join counters, the
 * sinks and the run's end, a parent's waiting stage woken — or, for a refusal that fails the
 * run, the group failure (`failRunsFrom`: the run failed, its unended stages and child runs
 * cancelled). Called inside the caller's transaction, after the stage row was moved to its
 * terminal state under its row lock. Returns the stages it queued (to notify the transport,
 * with the attempt their next claim creates) and the run's end, if it ended.
 */
export interface EndedStage {
  stageId: string;
  runId: string;
  seq: number;
  outcome: 'succeeded' | 'failed';
  /** The output (succeeded). */
  value?: unknown;
  /** The failure (failed): kept as a value `{ ok: false, error }` when asValue, else the run's error. */
  error?: unknown;
  /** A failure kept as a value (an agent's refused call; continueOnError): what follows goes on. */
  asValue?: boolean;
}

export interface Settled {
  /** Stages this settled made due, with the attempt their next claim creates (the transport's job id). */
  queued: { id: string; toolClass: string; definitionHash: string; attempt: number }[];
  runEnded: 'succeeded' | 'failed' | null;
}

/** The stage counts as done ($2: its value): its successors' joins, the run's sinks, a parent woken. */
const SETTLE_DONE_SQL = `
WITH RECURSIVE clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
src AS (
  SELECT s.id, s.run_id, s.fence, s.next_seqs, NULL::int AS next_seq, s.sink, coalesce(s.step, s.name) AS step,
    $2::jsonb AS value, false AS skipped, false AS claim_next, NULL::jsonb AS next_input
  FROM ratchet.stages s JOIN ratchet.runs r ON r.id = s.run_id
  WHERE s.id = $1::bigint AND r.state IN (${RUN_ACTIVE})
),${settleFrom('src', 'w')},
ev AS (INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data) SELECT * FROM w_events)
SELECT j.id::text AS id, j.tool_class, j.definition_hash, j.attempt, NULL::text AS run_state FROM w_joined j WHERE j.state = 'queued'
UNION ALL
SELECT p.id::text, p.tool_class, p.definition_hash, x.attempt, NULL FROM w_parent_woken p JOIN ratchet.stages x ON x.id = p.id
UNION ALL
SELECT NULL, NULL, NULL, NULL, d.state FROM w_run_done d WHERE d.state = 'succeeded'`;

/**
 * The stage's failure ($2) fails its run: the group failure (failRunsFrom) — the run failed, its
 * unended stages (sibling calls awaiting approval and waits included) and child runs cancelled, the
 * open waits of every stage cancelled closed (`cancelled`), a failed child's parent woken.
 */
const SETTLE_FAIL_SQL = `
WITH RECURSIVE clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
src AS (SELECT s.run_id, 'failed'::text AS state, $2::jsonb AS error FROM ratchet.stages s WHERE s.id = $1::bigint),
${failRunsFrom('src', 'f')}
SELECT p.id::text AS id, x.tool_class, x.definition_hash, x.attempt, NULL::text AS run_state
FROM f_parent_woken p JOIN ratchet.stages x ON x.id = p.id
UNION ALL
SELECT NULL, NULL, NULL, NULL, 'failed' FROM f_run_failed`;

export async function settleEnded(tx: Queryable, s: EndedStage): Promise<Settled> {
  const fails = s.outcome === 'failed' && !s.asValue;
  const value = s.outcome === 'succeeded' ? (s.value ?? null) : { ok: false, error: s.error ?? null };
  const rows = await tx.query(fails ? SETTLE_FAIL_SQL : SETTLE_DONE_SQL, [s.stageId, JSON.stringify(fails ? (s.error ?? null) : value)]);
  const out: Settled = { queued: [], runEnded: null };
  for (const r of rows) {
    if (r.run_state) out.runEnded = r.run_state as 'succeeded' | 'failed';
    else
      out.queued.push({
        id: r.id as string,
        toolClass: r.tool_class as string,
        definitionHash: r.definition_hash as string,
        attempt: (r.attempt as number) + 1,
      });
  }
  return out;
}
