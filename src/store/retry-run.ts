import { assertTransition, type RunState } from '../planner/states.js';
import type { Db, Queryable } from './db.js';
import { transactionAgain } from './db-errors.js';
import { isUuid } from './runs.js';
import { RELEASE_CHILD_RUN_SQL, RETRY_RUN_SQL, REVIVED_CHILD_STAGES_SQL, STAGE_WAITS_FOR_CHILD_SQL } from './runs.sql.js';

// The transitions RETRY_RUN_SQL writes must be in the state table; checked when this module loads.
assertTransition('run', 'failed', 'running');
assertTransition('stage', 'failed', 'queued');
assertTransition('stage', 'cancelled', 'pending');
assertTransition('stage', 'failed', 'waiting');
assertTransition('stage', 'cancelled', 'waiting');
assertTransition('stage', 'queued', 'waiting');

export interface RetryResult {
  /** false when nothing moved: see `reason`. */
  retried: boolean;
  previousState: RunState;
  /** Why nothing moved: the run is not failed, has no failed stage, or its deadline passed. */
  reason: 'not_failed' | 'no_failed_stage' | 'deadline_passed' | 'parent_ended' | null;
  /** The failed stage the run is retried from (also when nothing moved, if there is one). */
  stage: { id: string; seq: number; name: string; tool: string; toolClass: string; attemptsUsed: number; error: unknown } | null;
  /** The run's failed stages this retry queued again, in seq order (`stage` first; a statement can fail several). */
  retriedStageIds: string[];
  /** Every stage of the run this retry queued (its failed stages, and branches the failure cancelled that were due), to wake. */
  queued: { stageId: string; toolClass: string }[];
  /** Stages of its child runs this retry queued (retried with it: see retryRun), to wake. */
  childQueued: { stageId: string; toolClass: string; definitionHash: string }[];
}

/**
 * Retries a failed run from its failed stages (RETRY_RUN_SQL) with a fresh attempt budget; the
 * history stays in the events. Null for an unknown id. With its child runs (the run graph), in
 * the same transaction, as a user of Temporal's or Inngest's "retry from the failure" expects:
 * - a child-run stage the retry revived whose child run FAILED: the child is retried too, in place
 *   (same run, same idempotency keys, its succeeded stages kept: each effect once per key), and the
 *   stage waits for it again (`waiting`, woken by the child's end), recursively for grandchildren;
 * - whose child was CANCELLED by its parent's end (the group failure; `cancelled` is terminal for
 *   a run): the old child is detached from the stage (parent_stage_id cleared, parent_run_id kept,
 *   so it stays listed among the children) and the stage's claim starts a new child;
 * - a child that cannot be retried (expired, its deadline passed, cancelled by a person): the stage
 *   is queued, and its claim fails it again with the child's end (child_run_expired, ...).
 */
export async function retryRun(db: Db, runId: string): Promise<RetryResult | null> {
  if (!isUuid(runId)) return null;
  return transactionAgain(db, async (tx) => {
    const res = await retryOne(tx, runId);
    if (res?.retried) res.childQueued = await reattachChildren(tx, runId, 0);
    return res;
  });
}

const MAX_CHILD_DEPTH = 32;

async function reattachChildren(tx: Queryable, runId: string, depth: number): Promise<RetryResult['childQueued']> {
  const queued: RetryResult['childQueued'] = [];
  if (depth >= MAX_CHILD_DEPTH) return queued;
  for (const r of await tx.query(REVIVED_CHILD_STAGES_SQL, [runId])) {
    const stageId = r.stage_id as string;
    const childId = r.child_id as string;
    if (r.child_state === 'failed') {
      const child = await retryOne(tx, childId);
      if (child?.retried && child.stage) {
        await tx.query(STAGE_WAITS_FOR_CHILD_SQL, [stageId, 'waiting']);
        for (const q of child.queued) queued.push({ ...q, definitionHash: r.child_definition_hash as string });
        queued.push(...(await reattachChildren(tx, childId, depth + 1)));
        continue;
      }
    } else if (r.child_state === 'cancelled' && r.parent_ended === true) {
      await tx.query(RELEASE_CHILD_RUN_SQL, [childId]);
    }
    // A new child (the old one detached), or the child's end told again at the claim: the stage is due now.
    await tx.query(STAGE_WAITS_FOR_CHILD_SQL, [stageId, 'queued']);
  }
  return queued;
}

async function retryOne(q: Queryable, runId: string): Promise<RetryResult | null> {
  const [r] = await q.query(RETRY_RUN_SQL, [runId]);
  if (!r || r.previous_state === null || r.previous_state === undefined) return null;
  const previousState = r.previous_state as RunState;
  const stage = r.stage_id
    ? {
        id: r.stage_id as string,
        seq: r.seq as number,
        name: r.name as string,
        tool: r.tool as string,
        toolClass: r.tool_class as string,
        attemptsUsed: r.attempts_used as number,
        error: r.stage_error ?? null,
      }
    : null;
  const retried = r.retried === 1;
  const reason = retried
    ? null
    : previousState !== 'failed'
      ? 'not_failed'
      : !stage
        ? 'no_failed_stage'
        : r.deadline_passed === true
          ? 'deadline_passed'
          : r.parent_ended === true
            ? 'parent_ended'
            : 'not_failed';
  const queued = ((r.queued as RetryResult['queued'] | null | undefined) ?? []).filter(() => retried);
  const retriedStageIds = retried ? ((r.retried_stage_ids as string[] | undefined) ?? []) : [];
  return { retried, previousState, reason, stage, retriedStageIds, queued, childQueued: [] };
}
