import { PermanentError } from '../errors.js';
import type { RetryPolicy, Workflow } from '../definitions/types.js';
import { decideRetry } from '../planner/retry.js';
import { toJsonText } from '../store/json.js';
import type { ClaimedStage, FinishRow } from '../store/index.js';
import { describeError, payloadHash, type StageError } from '../worker/errors.js';

/**
 * The dispatcher: when an attempt ends, decides what happens next — the next stage queued
 * with its input computed now, a retry after its backoff, or the run terminal — as one
 * finish row, committed in the same statement as the fenced finish.
 */
export interface DispatchDeps {
  /** Outputs of the run's succeeded stages by step name (read only when a step needs them). */
  stageResults(runId: string): Promise<Record<string, unknown>>;
  random?: () => number;
}

/** Input of the next step: its `input` function over the run input and results, else the run's input. */
export async function nextStepInput(deps: DispatchDeps, workflow: Workflow, stage: ClaimedStage, output: unknown): Promise<unknown> {
  const step = workflow.steps[stage.seq];
  if (!step) throw new Error(`workflow ${workflow.name} has no step after ${stage.seq}`);
  if (!step.input) return stage.runInput;
  const results = stage.seq > 1 ? await deps.stageResults(stage.runId) : {};
  results[workflow.steps[stage.seq - 1]!.name] = output;
  return step.input({ input: stage.runInput, results });
}

export async function onSuccess(deps: DispatchDeps, workflow: Workflow, stage: ClaimedStage, output: unknown, data: Record<string, unknown>): Promise<FinishRow> {
  const base = { stageId: stage.id, fence: stage.fence, outcome: 'succeeded' as const, result: output, data: { ...data, resultHash: payloadHash(output) } };
  if (stage.seq >= workflow.steps.length) return { ...base, run: { state: 'succeeded', result: output } };
  let input: unknown;
  try {
    input = await nextStepInput(deps, workflow, stage, output);
    toJsonText(input ?? null, `steps[${stage.seq}].input`);
  } catch (err) {
    const error = describeError(new PermanentError(`computing the input of step ${stage.seq + 1} failed: ${(err as Error).message}`, { code: 'step_input_failed', cause: err }), stage.attempt, stage.fence);
    return { ...base, run: { state: 'failed', error } };
  }
  return { ...base, next: { seq: stage.seq + 1, input: input ?? null } };
}

/** A failed attempt: a retry after its backoff, or the run failed with the error (and the attempts) kept. */
export function onFailure(deps: DispatchDeps, tool: { name: string; retry: RetryPolicy }, stage: ClaimedStage, err: unknown, data: Record<string, unknown>): FinishRow {
  const error: StageError = describeError(err, stage.attempt, stage.fence);
  const decision = decideRetry({
    policy: tool.retry,
    attempt: stage.attempt,
    errorKind: error.kind,
    elapsedMs: stage.dbNow.getTime() - stage.firstClaimedAt.getTime(),
    random: deps.random,
  });
  const eventData = { ...data, error };
  if (decision.retry) return { stageId: stage.id, fence: stage.fence, outcome: 'queued', error, retryDelayMs: decision.delayMs, data: eventData };
  const runError = decision.reason === 'attempts_exhausted' || decision.reason === 'max_elapsed'
    ? { code: decision.reason, message: `${tool.name} failed after ${stage.attempt} attempt(s): ${error.message}`, attempts: stage.attempt, lastError: error }
    : error;
  return { stageId: stage.id, fence: stage.fence, outcome: 'failed', error: runError, run: { state: 'failed', error: runError }, data: { ...eventData, decision: decision.reason } };
}

/** A permanent failure that does not involve the tool (changed definition, deadline). */
export function terminal(stage: ClaimedStage, outcome: 'failed' | 'cancelled', runState: 'failed' | 'expired', error: { code: string; message: string }): FinishRow {
  return { stageId: stage.id, fence: stage.fence, outcome, error, run: { state: runState, error }, data: { error } };
}
