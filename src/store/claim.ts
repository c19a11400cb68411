import { z } from 'zod';
import type { Db, Queryable, Row } from './db.js';
import {
  CLAIM_IDS_SQL, claimSql, COUNT_RATE_SQL, COUNT_RUNNING_CLASS_SQL, COUNT_RUNNING_KEYS_SQL, LOCK_CLASS_SQL, LOCK_KEYS_SQL,
  pickCandidatesSql, RECORD_RATE_SQL,
} from './claim.sql.js';
import { monotonicNow, toClaimed, type ClaimedStage } from './lease.js';
import { parseInput } from './validate.js';

export const claimLimitsSchema = z.object({
  /** At most this many stages of the class hold a live lease at once, across all workers. */
  classConcurrency: z.number().int().min(1).max(100_000).optional(),
  /** At most `max` claims of the class start in any window of `windowMs`, across all workers. */
  rate: z.object({ max: z.number().int().min(1).max(1_000_000), windowMs: z.number().int().min(1).max(2 ** 31 - 1) }).strict().optional(),
  /** The class has stages under concurrency keys: count live leases per key before claiming. */
  keyed: z.boolean().optional(),
}).strict();
export type ClaimLimits = z.input<typeof claimLimitsSchema>;

const claimArgs = z.object({
  owner: z.string().min(1).max(200),
  toolClass: z.string().min(1).max(200),
  limit: z.number().int().min(1).max(1000),
  limits: claimLimitsSchema.optional(),
}).strict();

/**
 * Claims up to `limit` due stages of one tool class. Without limits: one atomic statement
 * (stages under a concurrency key are left alone). With limits: one short transaction that
 * serialises the class's claims (advisory lock), counts live leases and the rate window by
 * the database clock, locks the candidates' concurrency keys in sorted order and counts their
 * live leases, then claims only what fits — so the limits hold whatever the number of workers
 * and whichever path woke them. Rows with state 'failed' are stages whose attempt budget was
 * spent (not claimed).
 */
export async function claim(db: Db, args: z.input<typeof claimArgs>): Promise<ClaimedStage[]> {
  const { owner, toolClass, limit, limits } = parseInput(claimArgs, args, 'claim');
  const sentAt = monotonicNow(); // read before asking the pool for a connection
  const limited = limits && (limits.classConcurrency !== undefined || limits.rate !== undefined || limits.keyed);
  const rows = limited
    ? await db.transaction((tx) => claimLimited(tx, owner, toolClass, limit, limits))
    : await db.query(claimSql(limit), [owner, toolClass], `ratchet_claim_${limit}`);
  return rows.map((r) => toClaimed(r, sentAt));
}

async function claimLimited(tx: Queryable, owner: string, toolClass: string, limit: number, limits: z.output<typeof claimLimitsSchema>): Promise<Row[]> {
  let budget = limit;
  if (limits.classConcurrency !== undefined || limits.rate) {
    await tx.query(LOCK_CLASS_SQL, [toolClass], 'ratchet_lock_class');
    if (limits.classConcurrency !== undefined) {
      const [r] = await tx.query(COUNT_RUNNING_CLASS_SQL, [toolClass], 'ratchet_count_running_class');
      budget = Math.min(budget, limits.classConcurrency - (r!.n as number));
    }
    if (limits.rate) {
      const [r] = await tx.query(COUNT_RATE_SQL, [toolClass, limits.rate.windowMs], 'ratchet_count_rate');
      budget = Math.min(budget, limits.rate.max - (r!.n as number));
    }
  }
  if (budget <= 0) return [];
  // Keyed stages may be skipped for their key's limit: look a little further than the budget.
  const window = Math.min(1000, limits.keyed ? budget * 4 : budget);
  const cands = await tx.query(pickCandidatesSql(window), [owner, toolClass], `ratchet_pick_${window}`);
  let chosen = cands;
  const keys = [...new Set(cands.map((c) => c.concurrency_key as string | null).filter((k): k is string => k !== null))].sort();
  if (keys.length > 0) {
    await tx.query(LOCK_KEYS_SQL, [keys], 'ratchet_lock_keys');
    const live = new Map((await tx.query(COUNT_RUNNING_KEYS_SQL, [keys], 'ratchet_count_running_keys')).map((r) => [r.key as string, r.n as number]));
    chosen = cands.filter((c) => {
      const key = c.concurrency_key as string | null;
      if (key === null) return true;
      const n = live.get(key) ?? 0;
      if (n >= (c.concurrency_limit as number)) return false;
      live.set(key, n + 1);
      return true;
    });
  }
  chosen = chosen.slice(0, budget);
  if (chosen.length === 0) return [];
  const rows = await tx.query(CLAIM_IDS_SQL, [owner, chosen.map((c) => c.id as string)], 'ratchet_claim_ids');
  const started = rows.filter((r) => r.state === 'running').length;
  if (limits.rate && started > 0) await tx.query(RECORD_RATE_SQL, [toolClass, started], 'ratchet_record_rate');
  return rows;
}
