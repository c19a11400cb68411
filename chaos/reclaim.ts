import type { FaultKind, History, StageLogRow } from './history.js';
import { isClaim, type LeaseInterval } from './leases.js';

/**
 * Reclaim after a SIGKILL, measured from the history (issue 13's goal: p99 within the lease plus
 * one second of the kill): for each stage the killed worker held a live lease on, the time from
 * the kill to its next claim, when that claim takes over the dead worker's lease. Each sample is also split where the time went, so a missed goal
 * says why: the lease still running after the kill (the lease minus the age of its last
 * extension: the engine's heartbeat), then the wait after the lease ended, with what else
 * happened meanwhile: claims of the same class that went to other stages (the claim preferred
 * other work over the expired lease), a PostgreSQL or Redis restart, or another fault.
 */
export interface ReclaimSample {
  stageId: string;
  toolClass: string;
  key: string | null;
  kill: number;
  /** Kill -> next claim. */
  ms: number;
  /** The stage's own lease (its class's): the goal is a reclaim within it plus one second of the kill. */
  leaseMs: number;
  /** ms - leaseMs: how far past its own lease the stage was reclaimed (the goal: p99 <= 1 s). */
  beyondLeaseMs: number;
  /** Kill -> the end of the lease the dead worker held. */
  leaseLeftMs: number;
  /** Lease end -> next claim. */
  afterLeaseMs: number;
  /** Claims of other stages of the same class between the lease's end and the reclaim (new leases, not reclaims). */
  otherClaimsMeanwhile: number;
  /** Faults (other than the kill) acting between the kill and the reclaim. */
  faultsMeanwhile: FaultKind[];
}

const BACKGROUND: FaultKind[] = [
  'duplicate_submit',
  'cancel',
  'retry',
  'rolling_deploy',
  'tenant_flood',
  'injection_failed',
  'approve',
  'reject',
  'signal',
];

/**
 * `defaultLeaseMs`: the lease of a stage whose log rows do not say it (histories recorded before
 * lease_ms was logged); 0 measures such a stage from the kill alone.
 */
export function reclaimSamples(
  h: History,
  intervals: LeaseInterval[],
  byStage: Map<string, StageLogRow[]>,
  defaultLeaseMs = 0,
): ReclaimSample[] {
  const out: ReclaimSample[] = [];
  const claimsByClass = new Map<string, StageLogRow[]>();
  for (const r of h.stageLog) if (isClaim(r)) claimsByClass.set(r.toolClass, [...(claimsByClass.get(r.toolClass) ?? []), r]);
  for (const f of h.faults) {
    if (f.kind !== 'sigkill' || !f.owner) continue;
    for (const iv of intervals) {
      if (iv.owner !== f.owner || iv.start > f.at || iv.end <= f.at) continue;
      const next = byStage.get(iv.stageId)?.find((r) => r.at > f.at && isClaim(r));
      // A reclaim takes over the dead worker's lease. A stage its own last statement ended after the
      // kill (sent just before it, committed after: a retry's backoff, a release) was not reclaimed.
      if (next?.oldState !== 'running' || next.oldFence !== iv.fence) continue;
      const leaseEnd = Math.min(iv.end, next.at);
      const leaseMs = byStage.get(iv.stageId)?.find((r) => r.leaseMs != null)?.leaseMs ?? defaultLeaseMs;
      out.push({
        stageId: iv.stageId,
        toolClass: iv.toolClass,
        key: iv.key,
        kill: f.at,
        ms: next.at - f.at,
        leaseMs,
        beyondLeaseMs: next.at - f.at - leaseMs,
        leaseLeftMs: leaseEnd - f.at,
        afterLeaseMs: next.at - leaseEnd,
        otherClaimsMeanwhile: (claimsByClass.get(iv.toolClass) ?? []).filter(
          (c) => c.stageId !== iv.stageId && c.at > leaseEnd && c.at < next.at && c.oldState !== 'running',
        ).length,
        faultsMeanwhile: h.faults
          .filter((g) => g !== f && !BACKGROUND.includes(g.kind) && g.at <= next.at && g.endAt >= f.at)
          .map((g) => g.kind),
      });
    }
  }
  return out;
}
