import type { StageLogRow } from './history.js';

/**
 * Lease intervals and the live-lease sweep, from the recorded stage log (chaos/history.ts): what
 * the invariant checker (chaos/checker.ts) and its graph checks (chaos/checker-graph.ts) share.
 */

export interface LeaseInterval {
  stageId: string;
  runId: string;
  fence: string;
  owner: string | null;
  toolClass: string;
  key: string | null;
  keyLimit: number | null;
  start: number;
  end: number;
  startTxid: string;
  endTxid: string | null;
  /** A map item's map stage (its seq) and step; null for any other stage. */
  item: { groupSeq: number; step: string } | null;
}

/** A write that hands the stage a new lease: into `running` with a new fence (or inserted running). */
export const isClaim = (r: StageLogRow): boolean =>
  r.newState === 'running' && r.newFence !== null && (r.oldState !== 'running' || r.oldFence !== r.newFence || r.op === 'insert');

/** Each fence's stage, from the trigger log (a fence is handed to one stage: fence_order checks it). */
export function stageOfFence(rows: StageLogRow[]): Map<string, string> {
  const m = new Map<string, string>();
  for (const r of rows) if (r.newFence !== null && !m.has(r.newFence)) m.set(r.newFence, r.stageId);
  return m;
}

export function byStage(rows: StageLogRow[]): Map<string, StageLogRow[]> {
  const m = new Map<string, StageLogRow[]>();
  for (const r of [...rows].sort((a, b) => a.id - b.id)) {
    let list = m.get(r.stageId);
    if (!list) m.set(r.stageId, (list = []));
    list.push(r);
  }
  return m;
}

/**
 * Lease intervals from the stage log: a lease starts at its claim's write and ends at the
 * first write that moves the stage off that fence or out of `running`, or when its last
 * lease_until passed without an extension, whichever is first. A write on the same fence
 * after the lease lapsed (by its transaction's clock) does not revive it: the lease stays
 * ended at its lease_until, and the write itself is a stale_engine_write (see check()).
 */
export function leaseIntervals(stageLog: StageLogRow[]): LeaseInterval[] {
  const out: LeaseInterval[] = [];
  for (const rows of byStage(stageLog).values()) {
    let open: (LeaseInterval & { leaseUntil: number }) | null = null;
    for (const r of rows) {
      if (open) {
        if (r.newState === 'running' && r.newFence === open.fence && r.txAt < open.leaseUntil) {
          if (r.newLeaseUntil !== null) open.leaseUntil = r.newLeaseUntil;
          continue;
        }
        const { leaseUntil, ...iv } = open;
        out.push({ ...iv, end: Math.min(r.at, leaseUntil), endTxid: r.at <= leaseUntil ? r.txid : null });
        open = null;
      }
      if (isClaim(r)) {
        open = {
          stageId: r.stageId,
          runId: r.runId,
          fence: r.newFence!,
          owner: r.newOwner,
          toolClass: r.toolClass,
          key: r.concurrencyKey,
          keyLimit: r.concurrencyLimit,
          start: r.at,
          end: Infinity,
          startTxid: r.txid,
          endTxid: null,
          item: r.itemIndex != null && r.groupSeq != null ? { groupSeq: r.groupSeq, step: r.step ?? '' } : null,
          leaseUntil: r.newLeaseUntil ?? Infinity,
        };
      }
    }
    if (open) {
      const { leaseUntil, ...iv } = open;
      out.push({ ...iv, end: leaseUntil });
    }
  }
  return out;
}

/**
 * Sweeps the intervals of one group; reports each moment more than `limit` are live. An end
 * and a start written by one transaction (the fast path: finish n and claim n + 1 together)
 * count as end-before-start.
 */
export function overLimit(intervals: LeaseInterval[], limit: number): { found: LeaseInterval[][]; peak: number } {
  const startOfTx = new Map<string, number>();
  for (const iv of intervals) startOfTx.set(iv.startTxid, Math.min(startOfTx.get(iv.startTxid) ?? Infinity, iv.start));
  const points: { t: number; d: 1 | -1; iv: LeaseInterval }[] = [];
  for (const iv of intervals) {
    // A lease that ended before its claim was written was never live: the claim's transaction
    // began (its now(), the lease's start) long before, e.g. waiting on a key lock held across a partition.
    if (iv.end <= iv.start) continue;
    points.push({ t: iv.start, d: 1, iv });
    const sameTx = iv.endTxid !== null ? startOfTx.get(iv.endTxid) : undefined;
    points.push({ t: sameTx !== undefined ? Math.min(iv.end, sameTx) : iv.end, d: -1, iv });
  }
  points.sort((a, b) => a.t - b.t || a.d - b.d);
  const live = new Set<LeaseInterval>();
  const found: LeaseInterval[][] = [];
  let peak = 0;
  for (const p of points) {
    if (p.d === -1) live.delete(p.iv);
    else {
      live.add(p.iv);
      peak = Math.max(peak, live.size);
      if (live.size > limit) found.push([...live]);
    }
  }
  return { found, peak };
}
