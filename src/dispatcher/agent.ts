import { MODEL_STAGE_TOOL } from '../definitions/agent.js';
import type { AgentSpec, Workflow } from '../definitions/types.js';
import type { AssistantMessage, ModelStageResult } from '../agent/model-output.js';
import { validateActions, type PlannedAction } from '../planner/actions.js';
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

/** A validated action list as stages (each from its tool's class), then the next model call. */
function planFrom(agent: AgentSpec, afterSeq: number, actions: PlannedAction[]): PlanRow[] {
  const rows: PlanRow[] = actions.map((a, i) => ({
    seq: afterSeq + 1 + i,
    name: a.callId,
    tool: a.tool.name,
    toolClass: a.tool.class.name,
    state: i === 0 ? 'queued' : 'pending',
    leaseMs: a.tool.class.leaseMs,
    timeoutMs: a.tool.class.timeoutMs,
    maxDurationMs: a.tool.class.maxDurationMs,
    maxAttempts: a.tool.retry.maxAttempts,
    input: a.input,
  }));
  rows.push({ ...modelStage(agent), seq: afterSeq + actions.length + 1, state: rows.length === 0 ? 'queued' : 'pending', input: {} });
  return rows;
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
  const checked = validateActions(agent.tools, calls, agent.maxActions);
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

/** An agent's tool stage succeeded: the next planned stage (a tool call or the model) is queued with the input it holds. */
export function onAgentToolSuccess(stage: ClaimedStage, output: unknown, data: Record<string, unknown>): FinishRow {
  return {
    stageId: stage.id,
    fence: stage.fence,
    outcome: 'succeeded',
    result: output,
    data: { ...data, resultHash: payloadHash(output) },
    next: { seq: stage.seq + 1, input: null },
    nextKeepInput: true,
  };
}
