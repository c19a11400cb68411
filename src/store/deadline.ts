import { z } from 'zod';
import type { Queryable } from './db.js';
import { CANCEL_LEFTOVERS_SQL, EXPIRE_RUNS_SQL } from './deadline.sql.js';
import { parseInput } from './validate.js';

export interface ExpiredRuns {
  /** Runs that became `expired`. */
  expired: number;
  /** Stages that were running when their run expired: their workers learn it at their next extend. */
  runningStageIds: string[];
}

/** Expires at most `limit` runs whose deadline has passed by the database clock (one statement). */
export async function expireRuns(q: Queryable, limit: number): Promise<ExpiredRuns> {
  parseInput(z.number().int().min(1).max(10_000), limit, 'expireRuns.limit');
  const [r] = await q.query(EXPIRE_RUNS_SQL, [limit], 'ratchet_expire_runs');
  const runIds = (r?.run_ids as string[] | undefined) ?? [];
  if (runIds.length > 0) await cancelLeftovers(q, runIds, 'run_deadline');
  return { expired: (r?.expired as number | undefined) ?? 0, runningStageIds: (r?.running_stage_ids as string[] | undefined) ?? [] };
}

/** Cancels the stages a concurrent finish planned into runs that just ended (CANCEL_LEFTOVERS_SQL); returns how many. */
export async function cancelLeftovers(q: Queryable, runIds: string[], reason: 'run_deadline' | 'cancelled'): Promise<number> {
  const [r] = await q.query(CANCEL_LEFTOVERS_SQL, [runIds, reason], 'ratchet_cancel_leftovers');
  return (r?.cancelled as number | undefined) ?? 0;
}
