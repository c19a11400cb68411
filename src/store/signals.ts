import { RunAlreadyTerminalError, AlreadyDecidedError, SignalIdConflictError, UnknownRunError } from '../errors.js';
import { inputHash, signalTimeoutPending } from '../planner/waits.js';
import type { Db, Queryable } from './db.js';
import { transactionAgain } from './db-errors.js';
import { toJsonText } from './json.js';
import { ROW_HOLDING_IDLE_LIMIT_MS } from './transaction-on.js';
import { settleEnded, type Settled } from './waits-settle.js';

/**
 * Signals (issue 10): `POST /v1/runs/:id/signals/:name` and the start of a signal wait. Both
 * take one transaction-scoped advisory lock per (run, signal name) first, so each later
 * statement of either sees the other's commit: a signal is delivered to the waiting stage, or
 * kept and consumed when the wait starts — never lost between the two. (A single-statement
 * finish could not do this: its snapshot predates a concurrent commit it waited for.)
 */
const LOCK_SQL = `SELECT pg_advisory_xact_lock(hashtextextended('ratchet.signal:' || $1::text || ':' || $2::text, 0))`;

export interface SendSignalInput {
  runId: string;
  name: string;
  signalId: string;
  /** The payload as the step's schema parsed it (checked by the caller, who has the definition). */
  payload: unknown;
  /** The sender's identity (the token's), for the events. */
  sentBy: string | null;
}

export interface SignalDelivery {
  runId: string;
  name: string;
  signalId: string;
  /** 'delivered': its waiting stage took it (and succeeded with it); 'kept': no wait yet, the wait takes it when it starts. */
  status: 'delivered' | 'kept';
  /** true: this Signal-Id was sent before with this name and payload: nothing changed, the first outcome is told. */
  duplicate: boolean;
  /** The stage that took it (delivered), else null. */
  stageId: string | null;
  receivedAt: Date;
  /** What the delivery queued (to wake workers) and whether it ended the run. */
  settled: Settled;
}

const NOTHING: Settled = { queued: [], runEnded: null };

export async function sendSignal(db: Db, s: SendSignalInput): Promise<SignalDelivery> {
  const payloadText = toJsonText(s.payload ?? null, 'payload');
  const payloadHash = inputHash(s.payload ?? null);
  return transactionAgain(db, async (tx) => {
    await tx.query(LOCK_SQL, [s.runId, s.name]);
    // The run's row lock (shared): a cancel or a run end waits for this delivery, or this one sees it.
    const [run] = await tx.query(`SELECT state FROM ratchet.runs WHERE id = $1::uuid FOR SHARE`, [s.runId]);
    if (!run) throw new UnknownRunError(s.runId);
    const [earlier] = await tx.query(
      `SELECT name, payload_hash, consumed_by::text AS stage_id, received_at FROM ratchet.signals WHERE run_id = $1::uuid AND signal_id = $2`,
      [s.runId, s.signalId],
    );
    if (earlier) {
      if (earlier.name !== s.name || earlier.payload_hash !== payloadHash) throw new SignalIdConflictError(s.runId, s.signalId);
      return {
        runId: s.runId,
        name: s.name,
        signalId: s.signalId,
        status: earlier.stage_id ? 'delivered' : 'kept',
        duplicate: true,
        stageId: (earlier.stage_id as string | null) ?? null,
        receivedAt: earlier.received_at as Date,
        settled: NOTHING,
      };
    }
    if (run.state !== 'queued' && run.state !== 'running') throw new RunAlreadyTerminalError(s.runId, run.state as string);
    const [wait] = await tx.query(
      `SELECT w.stage_id::text AS stage_id, w.ended_at, w.outcome, s.state, s.seq, s.error
       FROM ratchet.waits w JOIN ratchet.stages s ON s.id = w.stage_id
       WHERE w.run_id = $1::uuid AND w.kind = 'signal' AND w.signal_name = $2
       ORDER BY w.ended_at IS NULL DESC, w.since DESC LIMIT 1
       FOR UPDATE OF w, s`,
      [s.runId, s.name],
    );
    // The step's wait already ended (timed out) and no new one will start: no wait will take this signal.
    // Say so; keep nothing. A stage queued or pending again whose claim begins a new wait (a run retried
    // from signal_timeout, a wait cancelled by the run's failure then revived), or already so claimed
    // (running, its new wait not begun: the begin takes this lock, then the kept signal): kept, as before a first wait.
    const waitsAgain =
      wait !== undefined &&
      (wait.state === 'queued' || wait.state === 'pending' || wait.state === 'running') &&
      !signalTimeoutPending(wait.outcome as string | null, wait.error);
    if (wait && wait.ended_at !== null && !waitsAgain) {
      throw new AlreadyDecidedError(s.runId, wait.stage_id as string, {
        outcome: `signal wait ${wait.outcome as string}`,
        decidedBy: null,
        decidedAt: (wait.ended_at as Date).toISOString(),
      });
    }
    const deliver = wait !== undefined && wait.state === 'waiting';
    const [row] = await tx.query(
      `INSERT INTO ratchet.signals (run_id, name, signal_id, payload, payload_hash, sent_by, received_at, consumed_at, consumed_by)
       VALUES ($1::uuid, $2, $3, $4::jsonb, $5, $6, ratchet.db_now(), CASE WHEN $7::bigint IS NULL THEN NULL ELSE ratchet.db_now() END, $7::bigint)
       RETURNING received_at`,
      [s.runId, s.name, s.signalId, payloadText, payloadHash, s.sentBy, deliver ? wait.stage_id : null],
    );
    const data = { signal: s.name, signalId: s.signalId, payloadHash, sentBy: s.sentBy };
    if (!deliver) {
      await tx.query(`INSERT INTO ratchet.events (run_id, type, at, data) VALUES ($1::uuid, 'signal_kept', ratchet.db_now(), $2::jsonb)`, [
        s.runId,
        JSON.stringify(data),
      ]);
      return {
        runId: s.runId,
        name: s.name,
        signalId: s.signalId,
        status: 'kept',
        duplicate: false,
        stageId: null,
        receivedAt: row!.received_at as Date,
        settled: NOTHING,
      };
    }
    const stageId = wait.stage_id as string;
    const settled = await completeSignalWait(tx, {
      runId: s.runId,
      stageId,
      seq: wait.seq as number,
      signalId: s.signalId,
      payloadText,
      data,
    });
    return {
      runId: s.runId,
      name: s.name,
      signalId: s.signalId,
      status: 'delivered',
      duplicate: false,
      stageId,
      receivedAt: row!.received_at as Date,
      settled,
    };
  });
}

/** The waiting stage takes the signal: its wait ends `signalled`, the stage succeeds with the payload, what follows is queued. */
async function completeSignalWait(
  tx: Queryable,
  c: { runId: string; stageId: string; seq: number; signalId: string; payloadText: string; data: Record<string, unknown> },
): Promise<Settled> {
  await tx.query(
    `UPDATE ratchet.waits SET ended_at = ratchet.db_now(), outcome = 'signalled', signal_id = $2 WHERE stage_id = $1::bigint AND ended_at IS NULL`,
    [c.stageId, c.signalId],
  );
  await tx.query(
    `UPDATE ratchet.stages SET state = 'succeeded', result = $2::jsonb, error = NULL, finished_at = ratchet.db_now(), updated_at = ratchet.db_now()
     WHERE id = $1::bigint`,
    [c.stageId, c.payloadText],
  );
  await tx.query(
    `INSERT INTO ratchet.events (run_id, stage_id, type, at, data)
     VALUES ($1::uuid, $2::bigint, 'signal_received', ratchet.db_now(), $3::jsonb),
            ($1::uuid, $2::bigint, 'wait_ended', ratchet.db_now(), jsonb_build_object('kind', 'signal', 'outcome', 'signalled')),
            ($1::uuid, $2::bigint, 'stage_succeeded', ratchet.db_now(), NULL)`,
    [c.runId, c.stageId, JSON.stringify(c.data)],
  );
  return settleEnded(tx, { stageId: c.stageId, runId: c.runId, seq: c.seq, outcome: 'succeeded', value: JSON.parse(c.payloadText) });
}

/** The stage a wait begins from: its current attempt, fenced like a finish (owner, token, live lease). */
export interface FencedStage {
  stageId: string;
  owner: string;
  fence: string;
}

export type BeginWaitResult =
  /** The stage waits without a lease (state waiting / awaiting_approval) until `until` (null: no timeout). */
  | { verdict: 'waiting'; since: Date; until: Date | null }
  /** A signal wait that found a signal kept before it: consumed, the stage succeeded with its payload. */
  | { verdict: 'consumed'; signalId: string; settled: Settled }
  /** The lease was lost (zero rows, as a finish's result_rejected): nothing changed. */
  | { verdict: 'rejected' };

/**
 * The claim's wait decision applied (src/planner/waits.ts decided it): the running stage hands
 * back its lease and waits — `waiting` for a sleep or a signal, `awaiting_approval` for a person —
 * with its ratchet.waits row (since = now by the database clock; until = the sleep's end or the
 * timeout: an absolute time, or `inMs` from now). A signal wait first takes a signal kept for it
 * (under the (run, name) lock shared with sendSignal): then the stage succeeds at once.
 * A wait row left by an earlier wait of the stage (a retried run) is replaced; the events keep it.
 */
export async function beginWait(
  db: Db,
  f: FencedStage,
  w: {
    kind: 'sleep' | 'signal' | 'approval';
    signalName?: string;
    until: { at: Date } | { inMs: number } | null;
    /** The call's input as the claim computed it (an approval: what the person reads and may edit), stored on the stage. */
    input?: unknown;
  },
): Promise<BeginWaitResult> {
  const inputText = w.input === undefined ? null : toJsonText(w.input ?? null, 'input');
  return db.transaction(
    async (tx) => {
      // The (run, name) lock before the stage's row lock: sendSignal takes them in this order too (no deadlock).
      if (w.kind === 'signal') {
        const [r] = await tx.query(`SELECT run_id::text AS run_id FROM ratchet.stages WHERE id = $1::bigint`, [f.stageId]);
        if (!r) return { verdict: 'rejected' as const };
        await tx.query(LOCK_SQL, [r.run_id, w.signalName]);
      }
      const [st] = await tx.query(
        `SELECT id::text, run_id::text AS run_id, seq FROM ratchet.stages
       WHERE id = $1::bigint AND owner_id = $2 AND fence = $3::bigint AND state = 'running' AND lease_until > ratchet.db_now() FOR UPDATE`,
        [f.stageId, f.owner, f.fence],
      );
      if (!st) return { verdict: 'rejected' as const };
      const runId = st.run_id as string;
      if (w.kind === 'signal') {
        const [kept] = await tx.query(
          `SELECT id, signal_id, payload::text AS payload FROM ratchet.signals
         WHERE run_id = $1::uuid AND name = $2 AND consumed_at IS NULL ORDER BY id LIMIT 1 FOR UPDATE`,
          [runId, w.signalName],
        );
        if (kept) {
          await tx.query(`UPDATE ratchet.signals SET consumed_at = ratchet.db_now(), consumed_by = $2::bigint WHERE id = $1`, [
            kept.id,
            f.stageId,
          ]);
          await upsertWait(tx, f.stageId, runId, w.kind, w.signalName ?? null, null);
          const settled = await completeSignalWait(tx, {
            runId,
            stageId: f.stageId,
            seq: st.seq as number,
            signalId: kept.signal_id as string,
            payloadText: kept.payload as string,
            data: { signal: w.signalName, signalId: kept.signal_id, kept: true },
          });
          return { verdict: 'consumed' as const, signalId: kept.signal_id as string, settled };
        }
      }
      const until = w.until === null ? null : 'at' in w.until ? w.until.at : { inMs: w.until.inMs };
      const [row] = await upsertWait(tx, f.stageId, runId, w.kind, w.signalName ?? null, until);
      const state = w.kind === 'approval' ? 'awaiting_approval' : 'waiting';
      await tx.query(
        // The claim that decided the wait spent an attempt; the claim that ends it must have one (as graph2's waiting stages).
        // Attempt numbers stay one per claim (each with its fence: the timeline and the events key attempts by number), so
        // the budget grows instead; a run retry resets attempt to 0 and keeps it: one spare attempt per wait-and-retry cycle.
        `UPDATE ratchet.stages SET state = $2, owner_id = NULL, lease_until = NULL, heartbeat_at = NULL,
         max_attempts = attempt + max_attempts, input = coalesce($3::jsonb, input), updated_at = ratchet.db_now()
       WHERE id = $1::bigint`,
        [f.stageId, state, inputText],
      );
      await tx.query(
        `INSERT INTO ratchet.events (run_id, stage_id, type, fence, at, data)
       VALUES ($1::uuid, $2::bigint, $3, $4::bigint, ratchet.db_now(), $5::jsonb)`,
        [
          runId,
          f.stageId,
          w.kind === 'approval' ? 'approval_requested' : 'wait_started',
          f.fence,
          JSON.stringify({ kind: w.kind, signal: w.signalName ?? null, since: row!.since, until: row!.wait_until ?? null }),
        ],
      );
      return { verdict: 'waiting' as const, since: row!.since as Date, until: (row!.wait_until as Date | null) ?? null };
    },
    { idleLimitMs: ROW_HOLDING_IDLE_LIMIT_MS },
  );
}

async function upsertWait(
  tx: Queryable,
  stageId: string,
  runId: string,
  kind: string,
  signalName: string | null,
  until: Date | { inMs: number } | null,
) {
  const at = until instanceof Date ? until : null;
  const inMs = until !== null && !(until instanceof Date) ? until.inMs : null;
  return tx.query(
    `INSERT INTO ratchet.waits (stage_id, run_id, kind, signal_name, since, wait_until)
     VALUES ($1::bigint, $2::uuid, $3, $4, ratchet.db_now(),
       coalesce($5::timestamptz, ratchet.db_now() + make_interval(secs => $6::bigint / 1000.0)))
     ON CONFLICT (stage_id) DO UPDATE SET kind = excluded.kind, signal_name = excluded.signal_name, since = excluded.since,
       wait_until = excluded.wait_until, ended_at = NULL, outcome = NULL, decided_by = NULL, actor = NULL, reason = NULL,
       input_hash = NULL, signal_id = NULL
     RETURNING since, wait_until`,
    [stageId, runId, kind, signalName, at, inMs],
  );
}
