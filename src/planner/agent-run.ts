import { MODEL_STAGE_TOOL } from '../definitions/agent.js';
import type { AgentSpec, Workflow } from '../definitions/types.js';
import type { AssistantMessage, ModelStageResult } from '../agent/model-output.js';
import type { StageSpec } from '../store/index.js';
import { validateActions } from './actions.js';
import { offeredTools } from './waits.js';
import { planAgentAnswer } from './agent-plan.js';
import type { GraphStageSpec } from './graph.js';

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

/** A refused call, by reason and call id (never the model's arguments). */
export type RefusedAction = { callId: string | null; index: number | null; reason: string };

/** An earlier stage of the agent run, as the answer's decision reads it. */
export interface AgentHistoryStage {
  seq: number;
  tool: string;
  result?: unknown;
}

/**
 * What a model stage's answer decides, pure (the dispatcher turns it into the finish row):
 * - `end`: no tool calls, the run ends with the answer;
 * - `plan`: a valid action list, as the run graph's stages (planner/agent-plan.ts): the calls of one
 *   answer in parallel (or a chain with parallelToolCalls false), the next model call joining them;
 * - `replan`: an invalid list, its errors told to the model by a new model stage (at most maxReplans);
 * - `fail`: invalid again after maxReplans (invalid_actions), or more actions after maxSteps model
 *   calls (max_steps_exceeded): the model stage and the run fail (a retry asks the model again).
 */
export type ModelAnswerDecision = { result: ModelStageResult; modelCall: number; toolCalls: number } & (
  | { kind: 'end'; runResult: { answer: string } }
  | { kind: 'plan'; stages: GraphStageSpec[] }
  | { kind: 'replan'; replan: number; stages: GraphStageSpec[]; invalidActions: RefusedAction[] }
  | {
      kind: 'fail';
      error: { code: 'invalid_actions' | 'max_steps_exceeded'; message: string };
      detail: Record<string, unknown>;
      invalidActions?: RefusedAction[];
    }
);

export function decideModelAnswer(
  agent: AgentSpec,
  seq: number,
  answer: AssistantMessage,
  history: readonly AgentHistoryStage[],
): ModelAnswerDecision {
  const calls = answer.tool_calls ?? [];
  const earlier = history.filter((s) => s.tool === MODEL_STAGE_TOOL && s.seq < seq);
  const modelCall = earlier.length + 1;
  const replans = earlier.filter((s) => (s.result as ModelStageResult | null)?.invalid).length;
  const common = { modelCall, toolCalls: calls.length };
  if (calls.length === 0) return { ...common, kind: 'end', result: { message: answer }, runResult: { answer: answer.content ?? '' } };
  const checked = validateActions(offeredTools(agent), calls, agent.maxActions);
  if (!checked.ok) {
    const result: ModelStageResult = { message: answer, invalid: checked.errors };
    const invalidActions = checked.errors.map(({ callId, index, reason }) => ({ callId, index, reason }));
    if (replans < agent.maxReplans && modelCall < agent.maxSteps) {
      return { ...common, kind: 'replan', result, replan: replans + 1, stages: planAgentAnswer(agent, seq, []), invalidActions };
    }
    // The run's error names reasons and call ids only (it is copied into events, e.g. run_retried);
    // the refusals in full, which quote the model, stay on the model stage, beside its answer.
    const reasons = invalidActions.map((e) => `${e.reason}${e.callId ? ` (${e.callId})` : ''}`).join(', ');
    const message = `the model proposed invalid actions ${replans + 1} time(s); the last: ${reasons}`;
    return {
      ...common,
      kind: 'fail',
      result,
      error: { code: 'invalid_actions', message },
      detail: { errors: checked.errors },
      invalidActions,
    };
  }
  if (modelCall >= agent.maxSteps) {
    const message = `the agent reached maxSteps (${agent.maxSteps} model calls) and the model still proposed ${calls.length} action(s)`;
    return { ...common, kind: 'fail', result: { message: answer }, error: { code: 'max_steps_exceeded', message }, detail: {} };
  }
  return { ...common, kind: 'plan', result: { message: answer }, stages: planAgentAnswer(agent, seq, checked.actions) };
}
