import type { Db } from './db.js';
import { ROW_HOLDING_IDLE_LIMIT_MS } from './transaction-on.js';
import { settleEnded, type Settled } from './waits-settle.js';

/** A due approval wait, for the caller to build its refusal (it has the definitions). */
export interface DueApproval {
  runId: string;
  stageId: string;
  /** The stage's seq (its step in a static workflow). */
  seq: number;
  tool: string;
  definitionHash: string;
  since: Date;
  until: Date;
}

export interface WakeResult {
  /** Sleeps and signal timeouts queued again (a claim ends them: src/planner/waits.ts wakeSleep / signalTimedOut). */
  woken: { id: string; toolClass: string; definitionHash: string; attempt: number; kind: 'sleep' | 'signal' }[];
  /** Approvals refused by their timeout (approval_timeout). */
  timedOut: string[];
  /** Each refused approval with how long it waited (ms, by the database clock), for the decision-time metric. */
  decisions: { stageId: string; waitedMs: number }[];
  /** Rows this statement looked at (a full batch: call again). */
  seen: number;
  /** Wait rows closed because their stage had ended otherwise (a cancelled or expired run). */
  closed: number;
  settled: Settled[];
}

/**
 * The sweeper's part (phase 2 calls it each tick, like expireRuns): waits whose time has come by
 * the database clock, at most `limit`, oldest first, rows locked with SKIP LOCKED so sweepers of
 * several workers share the work. A sleep's end and a signal's timeout move the stage waiting ->
 * queued (its claim ends it: `{ sleptUntil }`, onTimeout or signal_timeout — user code, so in a
 * worker that has the definition). An approval's timeout is decided here: the stage fails with
 * the refusal `refuse` builds (approval_timeout), settled like a rejection; `refuse` answering
 * null (this process lacks the definition) leaves it for a sweeper that has it. A wait whose
 * stage already ended another way is closed as `cancelled`.
 *
 * Lock order: the run row first, then the wait and its stage (`FOR UPDATE OF r, w, s`, locked in
 * that order per row), as a decision (lockRun), cancel and the deadline expiry take them: a
 * timeout's settle, which updates the run, never waits on a run row while holding its stage.
 */
export async function wakeDueWaits(
  db: Db,
  limit: number,
  refuse: (due: DueApproval) => { error: unknown; asValue: boolean } | null,
  /**
   * The definition hashes this process can decide approval timeouts for (its loaded definitions);
   * null: all. Open approvals of other definitions are not read at all, so they cannot fill the
   * batch (oldest first) and starve the sleeps and timeouts behind them.
   */
  approvalHashes: readonly string[] | null = null,
): Promise<WakeResult> {
  return db.transaction(
    async (tx) => {
      const rows = await tx.query(
        `SELECT w.stage_id::text AS stage_id, w.run_id::text AS run_id, w.kind, w.since, w.wait_until, s.state, s.seq, s.tool, s.tool_class, s.definition_hash, s.attempt
       FROM ratchet.runs r JOIN ratchet.waits w ON w.run_id = r.id JOIN ratchet.stages s ON s.id = w.stage_id
       WHERE w.ended_at IS NULL AND w.wait_until <= ratchet.db_now()
         AND ($2::text[] IS NULL OR w.kind <> 'approval' OR s.state <> 'awaiting_approval' OR s.definition_hash = ANY($2::text[]))
       ORDER BY w.wait_until LIMIT $1
       FOR UPDATE OF r, w, s SKIP LOCKED`,
        [limit, approvalHashes === null ? null : [...approvalHashes]],
      );
      const out: WakeResult = { woken: [], timedOut: [], decisions: [], seen: rows.length, closed: 0, settled: [] };
      for (const r of rows) {
        const stageId = r.stage_id as string;
        const runId = r.run_id as string;
        const kind = r.kind as 'sleep' | 'signal' | 'approval';
        const waitingState = kind === 'approval' ? 'awaiting_approval' : 'waiting';
        // An approval's timeout settled above may have ended this row's run (a static step fails it), cancelling this
        // stage and closing its wait in this transaction: the rows read at the start are stale from then on.
        if (out.settled.length > 0) {
          const [now] = await tx.query(
            `SELECT s.state, w.ended_at IS NOT NULL AS ended FROM ratchet.stages s JOIN ratchet.waits w ON w.stage_id = s.id WHERE s.id = $1::bigint`,
            [stageId],
          );
          if (!now || now.ended === true) continue;
          r.state = now.state;
        }
        if (r.state !== waitingState) {
          await tx.query(`UPDATE ratchet.waits SET ended_at = ratchet.db_now(), outcome = 'cancelled' WHERE stage_id = $1::bigint`, [
            stageId,
          ]);
          out.closed++;
          continue;
        }
        if (kind !== 'approval') {
          const outcome = kind === 'sleep' ? 'woken' : 'timed_out';
          await tx.query(`UPDATE ratchet.waits SET ended_at = ratchet.db_now(), outcome = $2 WHERE stage_id = $1::bigint`, [
            stageId,
            outcome,
          ]);
          await tx.query(
            `UPDATE ratchet.stages SET state = 'queued', available_at = ratchet.db_now(), updated_at = ratchet.db_now() WHERE id = $1::bigint`,
            [stageId],
          );
          await tx.query(
            `INSERT INTO ratchet.events (run_id, stage_id, type, at, data)
           VALUES ($1::uuid, $2::bigint, 'wait_ended', ratchet.db_now(), jsonb_build_object('kind', $3::text, 'outcome', $4::text, 'until', $5::timestamptz))`,
            [runId, stageId, kind, outcome, r.wait_until],
          );
          out.woken.push({
            id: stageId,
            toolClass: r.tool_class as string,
            definitionHash: r.definition_hash as string,
            attempt: (r.attempt as number) + 1,
            kind,
          });
          continue;
        }
        const refusal = refuse({
          runId,
          stageId,
          seq: r.seq as number,
          tool: r.tool as string,
          definitionHash: r.definition_hash as string,
          since: r.since as Date,
          until: r.wait_until as Date,
        });
        if (!refusal) continue;
        await tx.query(`UPDATE ratchet.waits SET ended_at = ratchet.db_now(), outcome = 'timed_out' WHERE stage_id = $1::bigint`, [
          stageId,
        ]);
        await tx.query(
          // a refusal kept as a value (an agent's call) is marked as finish.sql.ts marks one: a run retry never starts from it
          `UPDATE ratchet.stages SET state = 'failed', error = CASE WHEN $3::boolean THEN $2::jsonb || '{"asValue": true}'::jsonb ELSE $2::jsonb END,
           finished_at = ratchet.db_now(), updated_at = ratchet.db_now() WHERE id = $1::bigint`,
          [stageId, JSON.stringify(refusal.error), refusal.asValue],
        );
        await tx.query(
          `INSERT INTO ratchet.events (run_id, stage_id, type, at, data)
         VALUES ($1::uuid, $2::bigint, 'approval_timed_out', ratchet.db_now(), jsonb_build_object('since', $3::timestamptz, 'until', $4::timestamptz)),
                ($1::uuid, $2::bigint, 'stage_failed', ratchet.db_now(), jsonb_build_object('error', $5::jsonb))`,
          [runId, stageId, r.since, r.wait_until, JSON.stringify(refusal.error)],
        );
        out.timedOut.push(stageId);
        out.decisions.push({ stageId, waitedMs: (r.wait_until as Date).getTime() - (r.since as Date).getTime() });
        out.settled.push(
          await settleEnded(tx, {
            stageId,
            runId,
            seq: r.seq as number,
            outcome: 'failed',
            error: refusal.error,
            asValue: refusal.asValue,
          }),
        );
      }
      return out;
    },
    { idleLimitMs: ROW_HOLDING_IDLE_LIMIT_MS },
  );
}
