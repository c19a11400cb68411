import type { Queryable } from './db.js';
import { cancelDescendants } from './deadline.js';
import { CANCEL_FAILED_LEFTOVERS_SQL } from './finish.sql.js';

/**
 * After a statement that failed runs (a finish's group failure; the claim's attempts_exhausted, the
 * extend's stage_duration_exceeded, failUnserved: failRunsFrom), cancel in a statement of its own what a
 * concurrent finish inserted into those runs meanwhile (CANCEL_FAILED_LEFTOVERS_SQL): the failed runs of
 * `stageIds` (stages that failed; those whose run did not fail are ignored) and `runIds`; then the child runs such a
 * finish started meanwhile, with theirs (cancelDescendants). Returns how many stages of the failed runs it cancelled.
 */
export async function cancelFailedLeftovers(q: Queryable, stageIds: string[], runIds: string[] = []): Promise<number> {
  if (stageIds.length === 0 && runIds.length === 0) return 0;
  const [r] = await q.query(CANCEL_FAILED_LEFTOVERS_SQL, [stageIds, runIds], 'ratchet_cancel_failed_leftovers');
  await cancelDescendants(q, (r?.run_ids as string[] | undefined) ?? [], 'parent_ended');
  return (r?.cancelled as number | undefined) ?? 0;
}
