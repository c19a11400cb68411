import { MODEL_STAGE_TOOL } from '../definitions/agent.js';
import type { AgentSpec, Workflow } from '../definitions/types.js';
import { runGraph } from './graph.js';
import { plannerFailure, type PlannerFailure } from './planner-error.js';

/** A stage that failed for good (its retries spent, or a permanent error). */
export interface FailedStage {
  seq: number;
  tool: string;
  /** A map item's map stage, else null. */
  groupSeq: number | null;
}

/**
 * What a failure for good does to the rest of the run:
 * - `value`: the stage ends `failed` but counts as done for the join (continueOnError; an agent's
 *   tool told to the model); later steps see `{ ok: false, error }`;
 * - `fail_run`: the run fails with the error, and every other stage that has not ended (pending,
 *   queued, waiting, and running: their leases revoked, their signals aborted with `cancelled`)
 *   is cancelled in the same statement, child runs included.
 */
export type FailureDecision = { kind: 'value' } | { kind: 'fail_run'; error?: PlannerFailure['error'] };

/**
 * The group-failure rule, pure. A static step (or a map item: its map step's setting) with
 * continueOnError keeps its failure as a value. An agent's tool call with onToolError
 * 'tell_model' is told to the model, up to maxToolErrors failed tool calls in the run (counting
 * this one: `toolErrorsSoFar` is the number already persisted, this one excluded); one more
 * fails the run with too_many_tool_errors. A model call's failure fails the run.
 */
export function decideFailure(workflow: Workflow, stage: FailedStage, toolErrorsSoFar = 0): FailureDecision {
  if (workflow.agent) {
    if (stage.tool === MODEL_STAGE_TOOL || workflow.agent.onToolError === 'fail') return { kind: 'fail_run' };
    const over = toolErrorsOver(workflow.agent, toolErrorsSoFar + 1);
    return over ? { kind: 'fail_run', error: over.error } : { kind: 'value' };
  }
  const node = runGraph(workflow).bySeq.get(stage.groupSeq ?? stage.seq);
  return node?.step.continueOnError ? { kind: 'value' } : { kind: 'fail_run' };
}

/**
 * The agent's bound on tool failures told to the model: more than maxToolErrors failed tool calls
 * in one run fails it with too_many_tool_errors. Asked when a tool fails (its own count may miss
 * a sibling failing at the same moment) and again when the next model call is claimed (which
 * sees every persisted failure): the bound holds exactly at the model call.
 */
export function toolErrorsOver(agent: AgentSpec, failedToolCalls: number): PlannerFailure | null {
  if (failedToolCalls <= agent.maxToolErrors) return null;
  return plannerFailure(
    'too_many_tool_errors',
    `${failedToolCalls} tool calls failed in this run; the agent tells at most ${agent.maxToolErrors} to the model (maxToolErrors)`,
    { failedToolCalls, maxToolErrors: agent.maxToolErrors },
  );
}

/** Failed tool calls in an agent run's history (model calls excluded; so are calls a person refused: a decision, not a tool error). */
export function failedToolCalls(history: readonly { tool: string; state: string; error?: unknown }[]): number {
  return history.filter((s) => s.tool !== MODEL_STAGE_TOOL && s.state === 'failed' && !isRefusal(s.error)).length;
}

const isRefusal = (error: unknown): boolean => {
  const code = (error as { code?: unknown } | null | undefined)?.code;
  return code === 'approval_rejected' || code === 'approval_timeout';
};
