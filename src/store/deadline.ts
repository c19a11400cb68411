import { z } from 'zod';
import type { Db, Queryable } from './db.js';
import { CANCEL_DESCENDANTS_SQL, CANCEL_LEFTOVERS_SQL, EXPIRE_RUNS_SQL } from './deadline.sql.js';
import { transactionAgain } from './db-errors.js';
import { parseInput } from './validate.js';

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
 * runs, their child runs recursively (CANCEL_DESCENDANTS_SQL) and the leftovers of those: four statements in one
 * transaction, asked again whole when PostgreSQL aborts it as a deadlock (transactionAgain). A statement that fails
 * rolls the expiry back with it, so the next sweep expires those runs again: an expired run never keeps a child
 * running for want of a follow-up that failed or a process that died between two statements.
 */
export async function expireRuns(db: Db, limit: number): Promise<ExpiredRuns> {
  parseInput(z.number().int().min(1).max(10_000), limit, 'expireRuns.limit');
  return transactionAgain(db, async (q) => {
    const [r] = await q.query(EXPIRE_RUNS_SQL, [limit], 'ratchet_expire_runs');
    const runIds = (r?.run_ids as string[] | undefined) ?? [];
    const runningStageIds = (r?.running_stage_ids as string[] | undefined) ?? [];
    const woken = ((r?.woken as ExpiredRuns['woken'] | null | undefined) ?? []).map((w) => ({ ...w, attempt: w.attempt + 1 }));
    let childrenCancelled = 0;
    const waitsExpired = (r?.waits_closed as string[] | undefined) ?? [];
    const waitsCancelled: string[] = [];
    if (runIds.length > 0) {
      await cancelLeftovers(q, runIds, 'run_deadline');
      const [d] = await q.query(CANCEL_DESCENDANTS_SQL, [runIds, 'parent_expired'], 'ratchet_cancel_descendants');
      const childIds = (d?.run_ids as string[] | undefined) ?? [];
      childrenCancelled = childIds.length;
      runningStageIds.push(...((d?.running_stage_ids as string[] | undefined) ?? []));
      waitsCancelled.push(...((d?.waits_closed as string[] | undefined) ?? []));
      if (childIds.length > 0) await cancelLeftovers(q, childIds, 'cancelled');
    }
    return { expired: (r?.expired as number | undefined) ?? 0, runningStageIds, woken, childrenCancelled, waitsExpired, waitsCancelled };
  });
}

/** Cancels the stages a concurrent finish planned into runs that just ended (CANCEL_LEFTOVERS_SQL); returns how many. */
export async function cancelLeftovers(q: Queryable, runIds: string[], reason: 'run_deadline' | 'cancelled'): Promise<number> {
  const [r] = await q.query(CANCEL_LEFTOVERS_SQL, [runIds, reason], 'ratchet_cancel_leftovers');
  return (r?.cancelled as number | undefined) ?? 0;
}
