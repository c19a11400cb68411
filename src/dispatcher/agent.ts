import { MODEL_STAGE_TOOL } from '../definitions/agent.js';
import type { AgentSpec, Workflow } from '../definitions/types.js';
import type { AssistantMessage, ModelStageResult } from '../agent/model-output.js';
import { validateActions, type PlannedAction } from '../planner/actions.js';
import { planAgentAnswer } from '../planner/agent-plan.js';
import { offeredTools } from '../planner/waits.js';
import type { GraphStageSpec } from '../planner/graph.js';
import type { ClaimedStage, FinishRow, RunStageRow, StageSpec } from '../store/index.js';
import { payloadHash } from '../worker/errors.js';

type PlanRow = NonNullable<FinishRow['plan']>[number];

/** The model call stage of an agent (its lease, timeout and retries: the model's class). */
export function modelStage(agent: AgentSpec): Omit<StageSpec, 'input'> {
  const c = agent.model.class;
  return {
    name: 'model',
    tool: MODEL_STAGE_TOOL,
    toolClass: c.name,
    leaseMs: c.leaseMs,
    timeoutMs: c.timeoutMs,
    maxDurationMs: c.maxDurationMs,
    maxAttempts: c.retry.maxAttempts,
  };
}

/** An agent run starts with one model call. */
export function planAgentRun(workflow: Workflow): StageSpec[] {
  return [{ ...modelStage(workflow.agent!), input: {} }];
}

/**
 * A validated action list as stages (each from its tool's class), then the next model call, as
 * the run graph (planner/agent-plan.ts): the calls of one answer run in parallel (or in a chain
 * with parallelToolCalls false) and the next model call joins them all.
 */
function planFrom(agent: AgentSpec, afterSeq: number, actions: PlannedAction[]): PlanRow[] {
  return planAgentAnswer(agent, afterSeq, actions).map(toPlanRow);
}

/** A planned stage of the run graph as a finish row's plan entry. */
export function toPlanRow(g: GraphStageSpec): PlanRow {
  return {
    seq: g.seq,
    name: g.name,
    step: g.step,
    tool: g.tool,
    toolClass: g.toolClass,
    state: g.state,
    leaseMs: g.leaseMs,
    timeoutMs: g.timeoutMs,
    maxDurationMs: g.maxDurationMs,
    maxAttempts: g.maxAttempts,
    input: g.input ?? null,
    deps: g.deps,
    nextSeqs: g.nextSeqs,
    depsLeft: g.depsLeft,
    continueOnError: g.continueOnError,
    sink: g.sink,
    ...(g.idempotencyKey !== undefined ? { idempotencyKey: g.idempotencyKey } : {}),
    ...(g.itemIndex !== undefined ? { itemIndex: g.itemIndex } : {}),
    ...(g.groupSeq !== undefined ? { groupSeq: g.groupSeq } : {}),
    ...(g.concurrencyKey !== undefined ? { concurrencyKey: g.concurrencyKey, concurrencyLimit: g.concurrencyLimit } : {}),
  };
}

/**
 * The dispatcher for a model stage's answer, committed with its fenced finish: no tool calls
 * ends the run with the answer; a valid action list is persisted as stages in the same
 * statement; an invalid one persists no tool stage — its errors go back to the model (a new
 * model stage) at most maxReplans times, then the model stage and the run fail with
 * invalid_actions. More actions after maxSteps model calls fail them too. A failed model
 * stage is what a retry of the run starts from (the model is asked again). The events carry
 * the answer's hash and size and each refusal's reason, never the model's text or arguments
 * (those stay in the stage's result, where payloads belong).
 */
export function onModelAnswer(
  agent: AgentSpec,
  stage: ClaimedStage,
  answer: AssistantMessage,
  history: readonly RunStageRow[],
  data: Record<string, unknown>,
): FinishRow {
  const base = { stageId: stage.id, fence: stage.fence, outcome: 'succeeded' as const };
  const calls = answer.tool_calls ?? [];
  const earlier = history.filter((s) => s.tool === MODEL_STAGE_TOOL && s.seq < stage.seq);
  const modelCalls = earlier.length + 1;
  const replans = earlier.filter((s) => (s.result as ModelStageResult | null)?.invalid).length;
  const info = {
    ...data,
    resultHash: payloadHash(answer),
    resultBytes: Buffer.byteLength(JSON.stringify(answer)),
    toolCalls: calls.length,
    modelCall: modelCalls,
  };

  if (calls.length === 0) {
    const result: ModelStageResult = { message: answer };
    return { ...base, result, data: info, run: { state: 'succeeded', result: { answer: answer.content ?? '' } } };
  }
  const checked = validateActions(offeredTools(agent), calls, agent.maxActions);
  if (!checked.ok) {
    const result: ModelStageResult = { message: answer, invalid: checked.errors };
    const refused = { ...info, invalidActions: checked.errors.map(({ callId, index, reason }) => ({ callId, index, reason })) };
    if (replans < agent.maxReplans && modelCalls < agent.maxSteps) {
      return { ...base, result, data: { ...refused, decision: 'replan', replan: replans + 1 }, plan: planFrom(agent, stage.seq, []) };
    }
    // The run's error names reasons and call ids only (it is copied into events, e.g. run_retried);
    // the refusals in full, which quote the model, stay on the model stage, beside its answer.
    const reasons = refused.invalidActions.map((e) => `${e.reason}${e.callId ? ` (${e.callId})` : ''}`).join(', ');
    const error = { code: 'invalid_actions', message: `the model proposed invalid actions ${replans + 1} time(s); the last: ${reasons}` };
    return failed(stage, error, { ...refused, decision: 'invalid_actions' }, { errors: checked.errors });
  }
  if (modelCalls >= agent.maxSteps) {
    const error = {
      code: 'max_steps_exceeded',
      message: `the agent reached maxSteps (${agent.maxSteps} model calls) and the model still proposed ${calls.length} action(s)`,
    };
    return failed(stage, error, { ...info, decision: 'max_steps_exceeded' });
  }
  return { ...base, result: { message: answer } satisfies ModelStageResult, data: info, plan: planFrom(agent, stage.seq, checked.actions) };
}

/** The model stage fails with its run: the stage a retry of the run starts from. */
function failed(
  stage: ClaimedStage,
  error: { code: string; message: string },
  data: Record<string, unknown>,
  detail: Record<string, unknown> = {},
): FinishRow {
  const stageError = { ...error, kind: 'permanent' as const, attempt: stage.attempt, fence: stage.fence, ...detail };
  return { stageId: stage.id, fence: stage.fence, outcome: 'failed', error: stageError, run: { state: 'failed', error }, data };
}
