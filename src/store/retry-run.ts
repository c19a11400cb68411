import { assertTransition, type RunState } from '../planner/states.js';
import type { Queryable } from './db.js';
import { RETRY_RUN_SQL } from './runs.sql.js';

// The transitions RETRY_RUN_SQL writes must be in the state table; checked when this module loads.
assertTransition('run', 'failed', 'running');
assertTransition('stage', 'failed', 'queued');
assertTransition('stage', 'cancelled', 'pending');

const isUuid = (s: string) => /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(s);

export interface RetryResult {
  /** false when nothing moved: see `reason`. */
  retried: boolean;
  previousState: RunState;
  /** Why nothing moved: the run is not failed, has no failed stage, or its deadline passed. */
  reason: 'not_failed' | 'no_failed_stage' | 'deadline_passed' | null;
  /** The failed stage the run is retried from (also when nothing moved, if there is one). */
  stage: { id: string; seq: number; name: string; tool: string; toolClass: string; attemptsUsed: number; error: unknown } | null;
}

/**
 * Retries a failed run from its failed stage (one conditional statement: RETRY_RUN_SQL) with a
 * fresh attempt budget; the history stays in the events. Null for an unknown id.
 */
export async function retryRun(q: Queryable, runId: string): Promise<RetryResult | null> {
  if (!isUuid(runId)) return null;
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
          : 'not_failed';
  return { retried, previousState, reason, stage };
}
