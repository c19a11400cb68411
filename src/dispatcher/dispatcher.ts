import { PermanentError } from '../errors.js';
import type { RetryPolicy, Workflow } from '../definitions/types.js';
import { decideRetry } from '../planner/retry.js';
import { toJsonText } from '../store/json.js';
import { monotonicNow, type ClaimedStage, type FinishRow } from '../store/index.js';
import { describeError, payloadHash, type StageError } from '../worker/errors.js';

/**
 * The dispatcher: when an attempt ends, decides what happens next — the next stage queued
 * with its input computed now, a retry after its backoff, or the run terminal — as one
 * finish row, committed in the same statement as the fenced finish.
 */
export interface DispatchDeps {
  /**
   * Outputs of the run's succeeded stages by step name (read only when a step needs them). A
   * store error propagates as it is: it is an unknown outcome to ask again, never the step's failure.
   */
  stageResults(runId: string): Promise<Record<string, unknown>>;
  random?: () => number;
}

export type StepInput = { ok: true; input: unknown } | { ok: false; error: PermanentError };

/**
 * The input of step `seq` (1-based) of a static workflow: its `input` function over the run's
 * input and the persisted results of earlier steps (plus `fresh`, the result of the stage
 * finishing now, not yet persisted), else the run's input. Only input() itself throwing, or
 * returning what is not JSON, is the step's failure (`step_input_failed`); reading the results
 * may throw a store error, which the caller asks again.
 */
export async function stepInput(
  deps: DispatchDeps,
  workflow: Workflow,
  run: { runId: string; runInput: unknown },
  seq: number,
  fresh?: { name: string; output: unknown },
): Promise<StepInput> {
  const step = workflow.steps[seq - 1];
  if (!step) throw new Error(`workflow ${workflow.name} has no step ${seq}`);
  if (!step.input) return { ok: true, input: run.runInput };
  const results = seq > (fresh ? 2 : 1) ? await deps.stageResults(run.runId) : {};
  if (fresh) results[fresh.name] = fresh.output;
  try {
    const input = step.input({ input: run.runInput, results }) ?? null;
    toJsonText(input, `steps[${seq - 1}].input`);
    return { ok: true, input };
  } catch (err) {
    const message = `computing the input of step ${seq} failed: ${(err as Error).message}`;
    return { ok: false, error: new PermanentError(message, { code: 'step_input_failed', cause: err }) };
  }
}

export async function onSuccess(
  deps: DispatchDeps,
  workflow: Workflow,
  stage: ClaimedStage,
  output: unknown,
  data: Record<string, unknown>,
): Promise<FinishRow> {
  const base = {
    stageId: stage.id,
    fence: stage.fence,
    outcome: 'succeeded' as const,
    result: output,
    data: { ...data, resultHash: payloadHash(output) },
  };
  if (stage.seq >= workflow.steps.length) return { ...base, run: { state: 'succeeded', result: output } };
  const seq = stage.seq + 1;
  const next = await stepInput(deps, workflow, stage, seq, { name: workflow.steps[stage.seq - 1]!.name, output });
  if (next.ok) return { ...base, next: { seq, input: next.input } };
  // The step after this one cannot start: it fails (with the run), and a retry of the run starts from it.
  const error = storable(describeError(next.error, stage.attempt, stage.fence));
  return { ...base, next: { seq, input: null, error }, run: { state: 'failed', error } };
}

/**
 * Time from the stage's first claim to now by the database clock: the claim's database now
 * plus the monotonic time since the claim was sent (an upper bound: the send came first).
 */
export function elapsedSinceFirstClaim(stage: ClaimedStage, now = monotonicNow()): number {
  return stage.dbNow.getTime() + Math.max(0, now - stage.sentAt) - stage.firstClaimedAt.getTime();
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
    policy: tool.retry,
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

/** A permanent failure that does not involve the tool (changed definition, deadline). */
export function terminal(
  stage: ClaimedStage,
  outcome: 'failed' | 'cancelled',
  runState: 'failed' | 'expired',
  error: { code: string; message: string },
): FinishRow {
  return { stageId: stage.id, fence: stage.fence, outcome, error, run: { state: runState, error }, data: { error } };
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
