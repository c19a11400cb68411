import type { RetryPolicy, Workflow } from '../definitions/types.js';
import { decideRetry } from '../planner/retry.js';
import { decideFailure } from '../planner/failure.js';
import { ITEM_SEQ_STRIDE } from '../planner/map.js';
import type { PlannerError } from '../planner/planner-error.js';
import { MODEL_STAGE_TOOL } from '../definitions/agent.js';
import { toJsonText } from '../store/json.js';
import { monotonicNow, type ClaimedStage, type FinishRow } from '../store/index.js';
import { describeError, payloadHash, type StageError } from '../worker/errors.js';

/**
 * The dispatcher: when an attempt ends, decides what happens next — the next stage queued
 * with its input computed now, a retry after its backoff, or the run terminal — as one
 * finish row, committed in the same statement as the fenced finish.
 */
export interface DispatchDeps {
  random?: () => number;
}

/** A stage succeeded with `output` (its successors are the finish's join to decide). */
export function succeededRow(stage: ClaimedStage, output: unknown, data: Record<string, unknown>): FinishRow {
  return {
    stageId: stage.id,
    fence: stage.fence,
    outcome: 'succeeded',
    result: output,
    data: { ...data, resultHash: payloadHash(output) },
  };
}

/**
 * The group-failure rule (planner/failure.ts) applied to a failure for good: kept as a value
 * (continueOnError; an agent's tool error told to the model) the stage counts as done for the
 * join and the run goes on; otherwise the run fails, and the finish cancels every other unended
 * stage of it (running ones see `cancelled` at their next extend).
 */
export function applyGroupRule(workflow: Workflow, stage: ClaimedStage, row: FinishRow): FinishRow {
  const groupSeq = stage.seq >= ITEM_SEQ_STRIDE ? Math.floor(stage.seq / ITEM_SEQ_STRIDE) : null;
  const d = decideFailure(workflow, { seq: stage.seq, tool: stage.tool, groupSeq });
  if (d.kind === 'value') {
    const { run: _run, ...rest } = row;
    return { ...rest, asValue: true, data: { ...row.data, decision: 'continue_on_error' } };
  }
  if (d.error) return { ...row, run: { state: 'failed', error: d.error }, data: { ...row.data, decision: d.error.code } };
  return row;
}

/** A failure the planner decided (input, when, items, a bound): permanent, never retried; then the group rule. */
export function groupFailure(workflow: Workflow, stage: ClaimedStage, error: PlannerError, data: Record<string, unknown>): FinishRow {
  const stageError = storable({ ...error, attempt: stage.attempt, fence: stage.fence });
  const row: FinishRow = {
    stageId: stage.id,
    fence: stage.fence,
    outcome: 'failed',
    error: stageError,
    run: { state: 'failed', error: stageError },
    data: { ...data, error: stageError, decision: error.code },
  };
  return workflow.agent && stage.tool === MODEL_STAGE_TOOL ? row : applyGroupRule(workflow, stage, row);
}

/**
 * Time from the stage's first claim to now by the database clock: the claim's database now
 * plus the monotonic time since the claim was sent (an upper bound: the send came first).
 */
export function elapsedSinceFirstClaim(stage: ClaimedStage, now = monotonicNow()): number {
  return stage.dbNow.getTime() + Math.max(0, now - stage.sentAt) - stage.firstClaimedAt.getTime();
}

/**
 * A retry policy with the stage row's attempt budget: the policy's maxAttempts when planned, raised by a
 * wait (an approval, a sleep or a signal begun at the stage's own claim, which counts an attempt) so the
 * tool still has all of its own. The finish (onFailure) and the extend past maxDuration count the same.
 */
export function withRowBudget(policy: RetryPolicy, stage: ClaimedStage): RetryPolicy {
  return stage.maxAttempts === policy.maxAttempts ? policy : { ...policy, maxAttempts: stage.maxAttempts };
}

/**
 * A failed attempt: a retry after its backoff, or the run failed with the error (and the
 * attempts) kept. maxElapsed is measured up to this decision, not to the attempt's claim.
 */
export function onFailure(
  deps: DispatchDeps,
  tool: { name: string; retry: RetryPolicy },
  stage: ClaimedStage,
  err: unknown,
  data: Record<string, unknown>,
): FinishRow {
  const error: StageError = storable(describeError(err, stage.attempt, stage.fence));
  const decision = decideRetry({
    policy: withRowBudget(tool.retry, stage),
    attempt: stage.attempt,
    errorKind: error.kind,
    elapsedMs: elapsedSinceFirstClaim(stage),
    random: deps.random,
  });
  const eventData = { ...data, error };
  if (decision.retry)
    return { stageId: stage.id, fence: stage.fence, outcome: 'queued', error, retryDelayMs: decision.delayMs, data: eventData };
  const runError =
    decision.reason === 'attempts_exhausted' || decision.reason === 'max_elapsed'
      ? {
          code: decision.reason,
          message: `${tool.name} failed after ${stage.attempt} attempt(s): ${error.message}`,
          attempts: stage.attempt,
          lastError: error,
        }
      : error;
  return {
    stageId: stage.id,
    fence: stage.fence,
    outcome: 'failed',
    error: runError,
    run: { state: 'failed', error: runError },
    data: { ...eventData, decision: decision.reason },
  };
}

/**
 * A finish row the database (or the encoder) refused for its data — a string jsonb cannot
 * hold, a value past a limit. The same data fails again however often it is asked, so the
 * stage fails for good, with what was refused named (never the payload itself).
 */
export function onUnstorable(stage: ClaimedStage, err: unknown, data: Record<string, unknown>): FinishRow {
  const error = storable({
    code: 'result_not_storable',
    kind: 'permanent',
    name: 'PermanentError',
    attempt: stage.attempt,
    fence: stage.fence,
    message: `what stage ${stage.seq} (${stage.tool}) produced cannot be stored: ${err instanceof Error ? err.message : String(err)}`,
  });
  return {
    stageId: stage.id,
    fence: stage.fence,
    outcome: 'failed',
    error,
    run: { state: 'failed', error },
    data: { ...data, error, decision: 'result_not_storable' },
  };
}

/** A permanent failure that does not involve the tool (a changed definition): the stage and its run fail. (A run past its deadline is expired by the expiry, deadline.ts.) */
export function terminal(stage: ClaimedStage, error: { code: string; message: string }): FinishRow {
  return { stageId: stage.id, fence: stage.fence, outcome: 'failed', error, run: { state: 'failed', error }, data: { error } };
}

/** Lone surrogates and U+0000: what PostgreSQL text and jsonb refuse. */
const UNSTORABLE_CHARS = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/**
 * An error as it can be stored: characters PostgreSQL refuses in its message are spelled out,
 * and details that are not storable JSON are dropped, so recording a failure never fails.
 */
export function storable<E extends { message: string; details?: unknown }>(error: E): E {
  const clean = (s: string) => s.replace(UNSTORABLE_CHARS, (c) => (c === '\u0000' ? '\\u0000' : '\ufffd'));
  const out: E & { code?: unknown } = { ...error, message: clean(error.message) };
  if (typeof out.code === 'string') out.code = clean(out.code);
  if (out.details !== undefined) {
    try {
      toJsonText(out.details);
    } catch {
      delete out.details;
    }
  }
  return out;
}
