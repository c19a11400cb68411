import type { AgentSpec } from '../definitions/types.js';
import type { AssistantMessage } from '../agent/model-output.js';
import { decideModelAnswer, type AgentHistoryStage } from '../planner/agent-run.js';
import type { GraphStageSpec } from '../planner/graph.js';
import type { ClaimedStage, FinishRow } from '../store/index.js';
import { payloadHash } from '../worker/errors.js';

// The agent's plan moved to the pure planner (planner/agent-run.ts); kept here for the importers that still name it.
export { modelStage, planAgentRun } from '../planner/agent-run.js';

type PlanRow = NonNullable<FinishRow['plan']>[number];

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
 * The finish row of a model stage's answer (the decision is the planner's: decideModelAnswer),
 * committed with its fenced finish: the run ended with the answer, the answer's stages planned in
 * the same statement, a replan, or the model stage and the run failed. The events carry the
 * answer's hash and size and each refusal's reason, never the model's text or arguments (those
 * stay in the stage's result, where payloads belong).
 */
export function onModelAnswer(
  agent: AgentSpec,
  stage: ClaimedStage,
  answer: AssistantMessage,
  history: readonly AgentHistoryStage[],
  data: Record<string, unknown>,
): FinishRow {
  const d = decideModelAnswer(agent, stage.seq, answer, history);
  const base = { stageId: stage.id, fence: stage.fence, outcome: 'succeeded' as const };
  const info = {
    ...data,
    resultHash: payloadHash(answer),
    resultBytes: Buffer.byteLength(JSON.stringify(answer)),
    toolCalls: d.toolCalls,
    modelCall: d.modelCall,
  };
  switch (d.kind) {
    case 'end':
      return { ...base, result: d.result, data: info, run: { state: 'succeeded', result: d.runResult } };
    case 'plan':
      return { ...base, result: d.result, data: info, plan: d.stages.map(toPlanRow) };
    case 'replan':
      return {
        ...base,
        result: d.result,
        data: { ...info, invalidActions: d.invalidActions, decision: 'replan', replan: d.replan },
        plan: d.stages.map(toPlanRow),
      };
    case 'fail':
      return failed(
        stage,
        d.error,
        { ...info, ...(d.invalidActions ? { invalidActions: d.invalidActions } : {}), decision: d.error.code },
        d.detail,
      );
  }
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
