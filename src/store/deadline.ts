import { z } from 'zod';
import type { Queryable } from './db.js';
import { EXPIRE_RUNS_SQL } from './deadline.sql.js';
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
  return { expired: (r?.expired as number | undefined) ?? 0, runningStageIds: (r?.running_stage_ids as string[] | undefined) ?? [] };
}
