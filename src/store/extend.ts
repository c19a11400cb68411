import { cancelFailedLeftovers } from './leftovers.js';
import type { z } from 'zod';
import type { DbSession, QueryOptions, Queryable } from './db.js';
import { EXTEND_SQL, RELEASE_SQL } from './extend.sql.js';
import { confirmedUntil, extendArgs, leasesArgs, monotonicNow } from './lease.js';
import { parseInput } from './validate.js';

/** What an extend found for one lease (see EXTEND_SQL for each word). */
export type ExtendVerdict = 'extended' | 'duration_exceeded' | 'run_deadline' | 'cancelled' | 'finished' | 'changed' | 'lost';
export interface ExtendResult {
  stageId: string;
  fence: string;
  verdict: ExtendVerdict;
  /** The row's state now (null when the row is gone). */
  state: string | null;
  leaseUntil: Date | null;
  dbNow: Date;
  /** For 'extended': the new local confirmation deadline (monotonic ms). */
  confirmedUntil: number | null;
}

/**
 * Extends all of one owner's leases in one statement. A missing row means lost; a statement
 * that throws means *unknown* (the caller keeps its old deadline), never lost. `opts.timeoutMs`
 * bounds the statement, connection included (the monotonic clock is read before either).
 */
export async function extend(q: Queryable, args: z.input<typeof extendArgs>, opts?: QueryOptions): Promise<ExtendResult[]> {
  const { owner, leases } = parseInput(extendArgs, args, 'extend');
  if (leases.length === 0) return [];
  const sentAt = monotonicNow();
  // Past maxDuration: the delay before the next attempt (none given: 0), or null for none (the policy's answer).
  const retryDelays = leases.map((l) => (l.retryDelayMs === undefined ? 0 : l.retryDelayMs));
  const rows = await q.query(
    EXTEND_SQL,
    [owner, leases.map((l) => l.stageId), leases.map((l) => l.fence), retryDelays],
    'ratchet_extend',
    opts,
  );
  // A last attempt past maxDuration failed its run (failRunsFrom): what a concurrent finish inserted meanwhile is cancelled now.
  const failed = rows.filter((r) => r.verdict === 'duration_exceeded' && r.state === 'failed').map((r) => r.id as string);
  if (failed.length > 0) await cancelFailedLeftovers(q, failed);
  return rows.map((r) => {
    const verdict = r.verdict as ExtendVerdict;
    const leaseUntil = (r.lease_until as Date | null) ?? null;
    const dbNow = r.db_now as Date;
    return {
      stageId: r.id as string,
      fence: r.fence as string,
      verdict,
      state: (r.state as string | null) ?? null,
      leaseUntil,
      dbNow,
      confirmedUntil: verdict === 'extended' && leaseUntil ? confirmedUntil(sentAt, leaseUntil, dbNow) : null,
    };
  });
}

/** Graceful shutdown: hands leases back at once. Returns the ids actually released. */
export async function release(q: Queryable, args: z.input<typeof leasesArgs>): Promise<{ stageId: string; toolClass: string }[]> {
  const { owner, leases } = parseInput(leasesArgs, args, 'release');
  if (leases.length === 0) return [];
  const rows = await q.query(RELEASE_SQL, [owner, leases.map((l) => l.stageId), leases.map((l) => l.fence)], 'ratchet_release');
  return rows.map((r) => ({ stageId: r.id as string, toolClass: r.tool_class as string }));
}

/** The lease keeper's link: extends on a connection of its own (DbSession), outside the pool. */
export interface Extender {
  extend(args: z.input<typeof extendArgs>, opts?: QueryOptions): Promise<ExtendResult[]>;
  close(): Promise<void>;
}

export function extenderOn(session: DbSession): Extender {
  return { extend: (args, opts) => extend(session, args, opts), close: () => session.close() };
}
