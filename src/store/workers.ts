import { cancelFailedLeftovers } from './leftovers.js';
import type { Queryable } from './db.js';
import {
  DELETE_WORKER_SQL,
  DUE_IN_SQL,
  FAIL_UNSERVED_SQL,
  SWEEP_SQL,
  UNSERVED_CLASSES_SQL,
  UPSERT_WORKER_SQL,
  NEXT_LEASE_EXPIRY_SQL,
} from './workers.sql.js';

export interface SweptStage {
  stageId: string;
  toolClass: string;
  definitionHash: string;
  attempt: number;
}
export interface Lane {
  toolClass: string;
  definitionHash: string;
}

/** A worker seen within this long counts as live (by default; the sweeper asks for 3 of its intervals when longer). */
export const LIVE_WORKER_MS = 15_000;

/**
 * A worker's presence: the classes it serves and the definitions (hashes) it has loaded. Answers
 * the workers of the database seen within `liveWithinMs`, this one included.
 */
export async function upsertWorker(
  q: Queryable,
  owner: string,
  classes: string[],
  definitions: string[],
  liveWithinMs = LIVE_WORKER_MS,
): Promise<number> {
  const [row] = await q.query(
    UPSERT_WORKER_SQL,
    [owner, classes, definitions, Math.max(1, Math.round(liveWithinMs))],
    'ratchet_upsert_worker',
  );
  return Number(row?.live ?? 1);
}

export async function deleteWorker(q: Queryable, owner: string): Promise<void> {
  await q.query(DELETE_WORKER_SQL, [owner]);
}

/** Due queued stages and expired leases of these lanes, about `limit` of each kind in all (at least 10 per lane). */
export async function sweep(q: Queryable, lanes: Lane[], limit: number, graceMs = 0): Promise<SweptStage[]> {
  if (lanes.length === 0) return [];
  const perLane = Math.max(10, Math.ceil(limit / lanes.length));
  const rows = await q.query(
    SWEEP_SQL,
    [lanes.map((l) => l.toolClass), lanes.map((l) => l.definitionHash), perLane, Math.max(0, Math.round(graceMs))],
    'ratchet_sweep',
  );
  return rows.map((r) => ({
    stageId: r.id as string,
    toolClass: r.tool_class as string,
    definitionHash: r.definition_hash as string,
    attempt: r.next_attempt as number,
  }));
}

export async function dueIn(q: Queryable, stageId: string): Promise<number> {
  if (!/^\d{1,19}$/.test(stageId)) return 0;
  const [r] = await q.query(DUE_IN_SQL, [stageId], 'ratchet_due_in');
  return (r?.wait as number | undefined) ?? 0;
}

export async function unservedClasses(q: Queryable, classes: string[], withinMs: number): Promise<string[]> {
  const rows = await q.query(UNSERVED_CLASSES_SQL, [classes, withinMs]);
  return rows.map((r) => r.tool_class as string);
}

/** Opt-in: fail stages of unserved classes due for longer than `afterMs` (and their runs). */
export async function failUnserved(q: Queryable, classes: string[], afterMs: number): Promise<number> {
  if (classes.length === 0) return 0;
  const [r] = await q.query(FAIL_UNSERVED_SQL, [classes, afterMs]);
  // Runs failed here (failRunsFrom): what a concurrent finish inserted into them meanwhile is cancelled now.
  await cancelFailedLeftovers(q, (r?.failed_ids as string[] | undefined) ?? []);
  return (r?.failed as number | undefined) ?? 0;
}

/** Milliseconds until the first live lease of these lanes expires (0: one has already); null when none is running. */
export async function nextLeaseExpiryMs(q: Queryable, lanes: Lane[]): Promise<number | null> {
  if (lanes.length === 0) return null;
  const [r] = await q.query(
    NEXT_LEASE_EXPIRY_SQL,
    [lanes.map((l) => l.toolClass), lanes.map((l) => l.definitionHash)],
    'ratchet_next_lease_expiry',
  );
  return r ? (r.wait_ms as number) : null;
}
