import { AlreadyDecidedError, NotAwaitingApprovalError } from '../errors.js';
import type { Db, Queryable } from './db.js';
import { transactionAgain } from './db-errors.js';
import { toJsonText } from './json.js';
import type { StageWait } from '../planner/waits.js';
import { settleEnded, type Settled } from './waits-settle.js';
import { decodeCursor, encodeCursor } from './list-runs.js';
import { RUN_ACTIVE } from './lease-common.sql.js';

/**
 * Approval decisions (issue 10). A decision is one conditional update of the stage's
 * ratchet.waits row (`ended_at IS NULL`): of any number of racing decisions exactly one finds
 * the row open (the others wait on its row lock, then re-read it ended) and wins; the others get
 * `already_decided` with the winner's decision. In the same transaction the stage moves:
 * approved -> queued (with the edited input, if any); rejected -> failed, and what follows is
 * settled (src/store/waits-settle.ts: the seam for graph2's settle fragment).
 */
export interface Decider {
  /** The token's identity (never the token). */
  decidedBy: string;
  /** The person's name as the caller gave it (`by`), if any. */
  actor: string | null;
}

export interface DecisionResult {
  runId: string;
  stageId: string;
  decision: 'approved' | 'rejected';
  decidedBy: string;
  actor: string | null;
  decidedAt: Date;
  reason: string | null;
  inputHash: string | null;
  /** When the stage started waiting for a person (the decision time metric: decidedAt - since). */
  since: Date;
  settled: Settled;
}

/** Ends the open approval wait of stage $1 (run $2) with a decision; zero rows when another decision (or the timeout) came first. */
const DECIDE_SQL = `
UPDATE ratchet.waits SET ended_at = ratchet.db_now(), outcome = $3, decided_by = $4, actor = $5, reason = $6, input_hash = $7
WHERE stage_id = $1::bigint AND run_id = $2::uuid AND kind = 'approval' AND ended_at IS NULL
RETURNING ended_at, since`;

/**
 * The run's row lock first, as cancel and a run's end take it (runs, then stages): a decision and a
 * cancel of one run queue up instead of deadlocking (a rejection's settle updates the run row).
 */
async function lockRun(tx: Queryable, runId: string, stageId: string): Promise<void> {
  const [r] = await tx.query(`SELECT state FROM ratchet.runs WHERE id = $1::uuid FOR UPDATE`, [runId]);
  if (!r) throw new NotAwaitingApprovalError(runId, null, 'no such run');
  // A run that ended (a sibling's failure may leave a call awaiting approval behind): nothing to decide;
  // a wait decided before it ended says who decided.
  if (r.state !== 'queued' && r.state !== 'running') await refuseLoser(tx, runId, stageId);
}

async function refuseLoser(tx: Queryable, runId: string, stageId: string): Promise<never> {
  const [w] = await tx.query(
    `SELECT outcome, decided_by, actor, ended_at FROM ratchet.waits WHERE stage_id = $1::bigint AND run_id = $2::uuid AND kind = 'approval'`,
    [stageId, runId],
  );
  if (!w) throw new NotAwaitingApprovalError(runId, stageId, 'this stage does not wait for approval');
  // Closed by its run's end (a cancel, the deadline, a sibling's failure), or left open by it: nobody decided; the stage no longer waits.
  if (w.outcome === null || w.outcome === 'cancelled' || w.outcome === 'expired') {
    const [now] = await tx.query(`SELECT state FROM ratchet.stages WHERE id = $1::bigint`, [stageId]);
    throw gone(runId, stageId, now?.state as string | undefined);
  }
  throw new AlreadyDecidedError(runId, stageId, {
    outcome: w.outcome as string,
    decidedBy: (w.decided_by as string | null) ?? (w.outcome === 'timed_out' ? 'its approvalTimeout' : null),
    decidedAt: (w.ended_at as Date).toISOString(),
  });
}

/** The stage no longer awaits approval (its run was cancelled or expired meanwhile): roll back, say so. */
function gone(runId: string, stageId: string, state: string | undefined): NotAwaitingApprovalError {
  return new NotAwaitingApprovalError(runId, stageId, `the stage is ${state ?? 'gone'}, not awaiting approval (its run ended)`, { state });
}

/** Approves: the stage goes awaiting_approval -> queued, with the approver's edited input (checked by the tool's schema already) if any. */
export async function approveStage(
  db: Db,
  a: { runId: string; stageId: string; by: Decider; reason: string | null; edited: { input: unknown; inputHash: string } | null },
): Promise<DecisionResult> {
  const inputText = a.edited ? toJsonText(a.edited.input, 'input') : null;
  return transactionAgain(db, async (tx) => {
    await lockRun(tx, a.runId, a.stageId);
    const [won] = await tx.query(DECIDE_SQL, [
      a.stageId,
      a.runId,
      'approved',
      a.by.decidedBy,
      a.by.actor,
      a.reason,
      a.edited?.inputHash ?? null,
    ]);
    if (!won) return refuseLoser(tx, a.runId, a.stageId);
    const [st] = await tx.query(
      `UPDATE ratchet.stages SET state = 'queued', input = coalesce($2::jsonb, input), available_at = ratchet.db_now(), updated_at = ratchet.db_now()
       WHERE id = $1::bigint AND state = 'awaiting_approval' RETURNING id::text, tool_class, definition_hash, attempt`,
      [a.stageId, inputText],
    );
    if (!st) {
      const [now] = await tx.query(`SELECT state FROM ratchet.stages WHERE id = $1::bigint`, [a.stageId]);
      throw gone(a.runId, a.stageId, now?.state as string | undefined);
    }
    await tx.query(
      `INSERT INTO ratchet.events (run_id, stage_id, type, at, data) VALUES ($1::uuid, $2::bigint, 'approval_granted', ratchet.db_now(), $3::jsonb)`,
      [
        a.runId,
        a.stageId,
        JSON.stringify({
          decidedBy: a.by.decidedBy,
          actor: a.by.actor,
          reason: a.reason,
          edited: a.edited !== null,
          inputHash: a.edited?.inputHash ?? null,
        }),
      ],
    );
    return {
      runId: a.runId,
      stageId: a.stageId,
      decision: 'approved' as const,
      decidedBy: a.by.decidedBy,
      actor: a.by.actor,
      decidedAt: won.ended_at as Date,
      reason: a.reason,
      inputHash: a.edited?.inputHash ?? null,
      since: won.since as Date,
      settled: {
        queued: [
          {
            id: st.id as string,
            toolClass: st.tool_class as string,
            definitionHash: st.definition_hash as string,
            attempt: (st.attempt as number) + 1,
          },
        ],
        runEnded: null,
      },
    };
  });
}

/**
 * Rejects: the stage goes awaiting_approval -> failed with `error` (approval_rejected, built by
 * src/planner/waits.ts refusalError with this decision's time), and what follows is settled: an
 * agent's refused call is a failure kept as a value (the next model call hears it), a static
 * step's fails the run (`asValue` false).
 */
export async function rejectStage(
  db: Db,
  a: { runId: string; stageId: string; by: Decider; reason: string | null; error: (decidedAt: Date) => unknown; asValue: boolean },
): Promise<DecisionResult> {
  return transactionAgain(db, async (tx) => {
    await lockRun(tx, a.runId, a.stageId);
    const [won] = await tx.query(DECIDE_SQL, [a.stageId, a.runId, 'rejected', a.by.decidedBy, a.by.actor, a.reason, null]);
    if (!won) return refuseLoser(tx, a.runId, a.stageId);
    const decidedAt = won.ended_at as Date;
    const error = a.error(decidedAt);
    const [st] = await tx.query(
      // a refusal kept as a value (an agent's call) is marked as finish.sql.ts marks one: a run retry never starts from it
      `UPDATE ratchet.stages SET state = 'failed', error = CASE WHEN $3::boolean THEN $2::jsonb || '{"asValue": true}'::jsonb ELSE $2::jsonb END,
         finished_at = ratchet.db_now(), updated_at = ratchet.db_now()
       WHERE id = $1::bigint AND state = 'awaiting_approval' RETURNING seq`,
      [a.stageId, JSON.stringify(error), a.asValue],
    );
    if (!st) {
      const [now] = await tx.query(`SELECT state FROM ratchet.stages WHERE id = $1::bigint`, [a.stageId]);
      throw gone(a.runId, a.stageId, now?.state as string | undefined);
    }
    await tx.query(
      `INSERT INTO ratchet.events (run_id, stage_id, type, at, data)
       VALUES ($1::uuid, $2::bigint, 'approval_rejected', ratchet.db_now(), $3::jsonb),
              ($1::uuid, $2::bigint, 'stage_failed', ratchet.db_now(), jsonb_build_object('error', $4::jsonb))`,
      [a.runId, a.stageId, JSON.stringify({ decidedBy: a.by.decidedBy, actor: a.by.actor, reason: a.reason }), JSON.stringify(error)],
    );
    const settled = await settleEnded(tx, {
      stageId: a.stageId,
      runId: a.runId,
      seq: st.seq as number,
      outcome: 'failed',
      error,
      asValue: a.asValue,
    });
    return {
      runId: a.runId,
      stageId: a.stageId,
      decision: 'rejected' as const,
      decidedBy: a.by.decidedBy,
      actor: a.by.actor,
      decidedAt,
      reason: a.reason,
      inputHash: null,
      since: won.since as Date,
      settled,
    };
  });
}

/** A stage waiting for a person, as `ratchet list --state awaiting_approval` and GET /v1/approvals show it. */
export interface PendingApproval {
  runId: string;
  workflow: string;
  stageId: string;
  seq: number;
  name: string;
  tool: string;
  input: unknown;
  since: Date;
  timeoutAt: Date | null;
}

/**
 * Stages awaiting approval on active runs, oldest first (waits_open_approval_idx); `runId` narrows to
 * one run. A run that ended (a sibling's failure can leave an untimed approval row open) is not listed:
 * nobody can decide on it (lockRun refuses).
 */
export async function listPendingApprovals(q: Queryable, opts: { runId?: string; limit?: number } = {}): Promise<PendingApproval[]> {
  return (await pendingApprovalRows(q, { ...opts, limit: opts.limit ?? 100 })).map((r) => r.approval);
}

/**
 * A page of listPendingApprovals narrowed to workflow `workflow` (in SQL: the page holds `limit` of
 * its approvals however many of other workflows are older), after `cursor` (a nextCursor this gave
 * out; an InvalidInputError when it is not one). nextCursor: null on the last page.
 */
export async function pendingApprovalsPage(
  q: Queryable,
  opts: { workflow?: string; cursor?: string; limit: number },
): Promise<{ approvals: PendingApproval[]; nextCursor: string | null }> {
  const cursor = opts.cursor === undefined ? undefined : decodeCursor(opts.cursor, 'cursor', '\\d{1,19}');
  const after = cursor && { since: cursor.createdAt, stageId: cursor.id };
  const rows = await pendingApprovalRows(q, {
    ...(opts.workflow ? { workflow: opts.workflow } : {}),
    ...(after ? { after } : {}),
    limit: opts.limit + 1,
  });
  const page = rows.slice(0, opts.limit);
  const last = page[page.length - 1];
  return {
    approvals: page.map((r) => r.approval),
    nextCursor: rows.length > opts.limit && last ? encodeCursor(last.since, last.approval.stageId) : null,
  };
}

async function pendingApprovalRows(
  q: Queryable,
  opts: { runId?: string; workflow?: string; after?: { since: string; stageId: string }; limit: number },
): Promise<{ approval: PendingApproval; since: string }[]> {
  // since_key: w.since in UTC to the microsecond (a Date would round it), the cursor's half with stage_id.
  const rows = await q.query(
    `SELECT w.run_id::text AS run_id, r.workflow, w.stage_id::text AS stage_id, s.seq, s.name, s.tool, s.input, w.since, w.wait_until,
       to_char(w.since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS since_key
     FROM ratchet.waits w JOIN ratchet.stages s ON s.id = w.stage_id JOIN ratchet.runs r ON r.id = w.run_id
     WHERE w.kind = 'approval' AND w.ended_at IS NULL AND s.state = 'awaiting_approval' AND r.state IN (${RUN_ACTIVE})
       AND ($1::uuid IS NULL OR w.run_id = $1::uuid)
       AND ($3::text IS NULL OR r.workflow = $3::text)
       AND ($4::timestamptz IS NULL OR (w.since, w.stage_id) > ($4::timestamptz, $5::bigint))
     ORDER BY w.since, w.stage_id LIMIT $2`,
    [opts.runId ?? null, opts.limit, opts.workflow ?? null, opts.after?.since ?? null, opts.after?.stageId ?? null],
  );
  return rows.map((r) => ({
    since: r.since_key as string,
    approval: {
      runId: r.run_id as string,
      workflow: r.workflow as string,
      stageId: r.stage_id as string,
      seq: r.seq as number,
      name: r.name as string,
      tool: r.tool as string,
      input: r.input ?? null,
      since: r.since as Date,
      timeoutAt: (r.wait_until as Date | null) ?? null,
    },
  }));
}

/** A run's waits (explain reads the one of its waiting stage). */
export async function waitsOf(
  q: Queryable,
  runId: string,
): Promise<
  {
    stageId: string;
    kind: 'sleep' | 'signal' | 'approval';
    signalName: string | null;
    since: Date;
    until: Date | null;
    endedAt: Date | null;
    outcome: string | null;
  }[]
> {
  const rows = await q.query(
    `SELECT stage_id::text AS stage_id, kind, signal_name, since, wait_until, ended_at, outcome FROM ratchet.waits WHERE run_id = $1::uuid ORDER BY since`,
    [runId],
  );
  return rows.map((r) => ({
    stageId: r.stage_id as string,
    kind: r.kind as 'sleep' | 'signal' | 'approval',
    signalName: (r.signal_name as string | null) ?? null,
    since: r.since as Date,
    until: (r.wait_until as Date | null) ?? null,
    endedAt: (r.ended_at as Date | null) ?? null,
    outcome: (r.outcome as string | null) ?? null,
  }));
}

/** A stage's waits row as its claim reads it (src/planner/decide.ts), or null when it never waited. */
export async function stageWait(q: Queryable, stageId: string): Promise<StageWait | null> {
  const [r] = await q.query(`SELECT kind, since, wait_until, outcome FROM ratchet.waits WHERE stage_id = $1::bigint`, [stageId]);
  if (!r) return null;
  return {
    kind: r.kind as StageWait['kind'],
    since: r.since as Date,
    until: (r.wait_until as Date | null) ?? null,
    outcome: (r.outcome as string | null) ?? null,
  };
}
