import { z } from 'zod';
import type { Db, Queryable } from './db.js';
import { CANCEL_DESCENDANTS_SQL, CANCEL_LEFTOVERS_SQL, EXPIRE_RUN_SQL, EXPIRE_RUNS_SQL, ORPHANED_PARENTS_SQL } from './deadline.sql.js';
import { transactionAgain } from './db-errors.js';
import { parseInput } from './validate.js';
import { isUuid } from './runs.js';
import { InvalidInputError } from '../errors.js';
import { ROW_HOLDING_IDLE_LIMIT_MS } from './transaction-on.js';

export interface ExpiredRuns {
  /** Runs that became `expired`. */
  expired: number;
  /** Stages that were running when their run expired (or a child run of it was cancelled): their workers learn it at their next extend. */
  runningStageIds: string[];
  /** Parent stages an expired child run queued again (to wake a worker of their class; the next claim is `attempt`). */
  woken: { stageId: string; toolClass: string; definitionHash: string; attempt: number }[];
  /** Child runs of the expired runs cancelled with them (recursively). */
  childrenCancelled: number;
  /** The kinds of the open waits (issue 10) these statements closed: `expired` in the expired runs, `cancelled` in their children. */
  waitsExpired: string[];
  waitsCancelled: string[];
}

/**
 * Expires at most `limit` runs whose deadline has passed by the database clock, then cancels the leftovers of those
 * runs and their child runs recursively with the leftovers of those (cancelDescendants), in one transaction, asked
 * again whole when PostgreSQL aborts it as a deadlock (transactionAgain) and cut short when its client stalls while it
 * holds the runs' rows. A statement that fails rolls the expiry back with it, so the next sweep expires those runs
 * again: an expired run never keeps a child running for want of a follow-up that failed or a process that died
 * between two statements.
 */
export async function expireRuns(db: Db, limit: number): Promise<ExpiredRuns> {
  parseInput(z.number().int().min(1).max(10_000), limit, 'expireRuns.limit');
  return expireWith(db, EXPIRE_RUNS_SQL, [limit], 'ratchet_expire_runs');
}

/**
 * The same for one run, if its deadline has passed by the database clock: what a claim that found it so
 * does (the executor), so the run ends as every expiry does (its waits `expired`, its stages and children
 * cancelled with reason run_deadline / parent_expired), whichever of the claim and the sweeper saw it first.
 */
export async function expireRun(db: Db, runId: string): Promise<ExpiredRuns> {
  if (!isUuid(runId)) throw new InvalidInputError(`not a run id: ${runId}`, 'expireRun.runId');
  return expireWith(db, EXPIRE_RUN_SQL, [runId], 'ratchet_expire_run');
}

async function expireWith(db: Db, sql: string, params: unknown[], name: string): Promise<ExpiredRuns> {
  return transactionAgain(
    db,
    async (q) => {
      const [r] = await q.query(sql, params, name);
      const runIds = (r?.run_ids as string[] | undefined) ?? [];
      const runningStageIds = (r?.running_stage_ids as string[] | undefined) ?? [];
      const woken = ((r?.woken as ExpiredRuns['woken'] | null | undefined) ?? []).map((w) => ({ ...w, attempt: w.attempt + 1 }));
      const waitsExpired = (r?.waits_closed as string[] | undefined) ?? [];
      const d = await sweepEnded(q, runIds, 'expired');
      runningStageIds.push(...d.runningStageIds);
      return {
        expired: (r?.expired as number | undefined) ?? 0,
        runningStageIds,
        woken,
        childrenCancelled: d.runIds.length,
        waitsExpired,
        waitsCancelled: d.waitsClosed,
      };
    },
    { idleLimitMs: ROW_HOLDING_IDLE_LIMIT_MS },
  );
}

/** Passes of cancelDescendants at most: each finds what a finish committed while the one before waited for its row. */
const DESCENDANT_PASSES = 5;

/** The child runs cancelDescendants cancelled, their stages that were running and the kinds of the waits it closed. */
export interface DescendantsCancelled {
  runIds: string[];
  runningStageIds: string[];
  waitsClosed: string[];
}

/**
 * The child runs of ended runs `runIds` that are still active, recursively, cancelled with their stages
 * (CANCEL_DESCENDANTS_SQL, event reason `reason`), then the leftovers of those. A finish that started a child run while
 * a statement waited for its stage committed a child that statement's snapshot never saw (the stage itself is then
 * cancelled, `waiting`, by the row's re-check): the next pass, a snapshot of its own, sees it. Asked again until a pass
 * cancels none (at most DESCENDANT_PASSES). Nothing when `runIds` is empty.
 */
export async function cancelDescendants(
  q: Queryable,
  runIds: string[],
  reason: 'parent_expired' | 'parent_cancelled' | 'parent_ended',
): Promise<DescendantsCancelled> {
  const out: DescendantsCancelled = { runIds: [], runningStageIds: [], waitsClosed: [] };
  for (let pass = 0; runIds.length > 0 && pass < DESCENDANT_PASSES; pass++) {
    const [d] = await q.query(CANCEL_DESCENDANTS_SQL, [runIds, reason], 'ratchet_cancel_descendants');
    const ids = (d?.run_ids as string[] | undefined) ?? [];
    if (ids.length === 0) break;
    out.runIds.push(...ids);
    out.runningStageIds.push(...((d?.running_stage_ids as string[] | undefined) ?? []));
    out.waitsClosed.push(...((d?.waits_closed as string[] | undefined) ?? []));
    await cancelLeftovers(q, ids, 'cancelled');
  }
  return out;
}

/** The reason a child run's cancel gives, by its parent's end. */
const REASON_BY_PARENT_STATE = { expired: 'parent_expired', cancelled: 'parent_cancelled', failed: 'parent_ended' } as const;

/**
 * What runs `runIds` that just ended `expired` or `cancelled` (or were asked to again) may still hold: their leftovers
 * (cancelLeftovers: `run_deadline` for an expired run) and their active child runs with theirs (cancelDescendants).
 * For the expiry and the cancel, in their transaction.
 */
export async function sweepEnded(q: Queryable, runIds: string[], state: 'expired' | 'cancelled'): Promise<DescendantsCancelled> {
  if (runIds.length > 0) await cancelLeftovers(q, runIds, state === 'expired' ? 'run_deadline' : 'cancelled');
  return cancelDescendants(q, runIds, REASON_BY_PARENT_STATE[state]);
}

/**
 * The sweeper's orphan pass: child runs left active under a parent that ended (ORPHANED_PARENTS_SQL, at most `limit`
 * parents) are cancelled with theirs (cancelDescendants), one transaction per kind of end. Nothing else would end them
 * when a failure's follow-up was lost to a process or connection that died first.
 */
export async function sweepOrphans(db: Db, limit: number): Promise<DescendantsCancelled & { parents: number }> {
  parseInput(z.number().int().min(1).max(10_000), limit, 'sweepOrphans.limit');
  const rows = await db.query(ORPHANED_PARENTS_SQL, [limit], 'ratchet_orphaned_parents');
  const out = { runIds: [] as string[], runningStageIds: [] as string[], waitsClosed: [] as string[], parents: rows.length };
  for (const [state, reason] of Object.entries(REASON_BY_PARENT_STATE)) {
    const ids = rows.filter((r) => r.state === state).map((r) => r.id as string);
    if (ids.length === 0) continue;
    const d = await transactionAgain(db, (tx) => cancelDescendants(tx, ids, reason), { idleLimitMs: ROW_HOLDING_IDLE_LIMIT_MS });
    out.runIds.push(...d.runIds);
    out.runningStageIds.push(...d.runningStageIds);
    out.waitsClosed.push(...d.waitsClosed);
  }
  return out;
}

/** Cancels the stages a concurrent finish planned into runs that just ended (CANCEL_LEFTOVERS_SQL); returns how many. */
export async function cancelLeftovers(q: Queryable, runIds: string[], reason: 'run_deadline' | 'cancelled'): Promise<number> {
  const [r] = await q.query(CANCEL_LEFTOVERS_SQL, [runIds, reason], 'ratchet_cancel_leftovers');
  return (r?.cancelled as number | undefined) ?? 0;
}
