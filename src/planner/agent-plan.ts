import { MODEL_STAGE_TOOL } from '../definitions/agent.js';
import type { AgentSpec } from '../definitions/types.js';
import type { PlannedAction } from './actions.js';
import type { GraphStageSpec } from './graph.js';

/**
 * The stages of one validated model answer, pure, as a graph: its tool calls each wait for the
 * model stage (inserted already queued, by the statement that finishes it) and the next model
 * call waits for all of them (its join counter = their number). With parallelToolCalls false
 * they form a chain instead, as before. A tool call that fails for good counts as done for the
 * join when the agent tells tool errors to the model (continueOnError). An empty list (a
 * re-plan after refused actions) is the next model call alone, queued.
 */
export function planAgentAnswer(agent: AgentSpec, modelSeq: number, actions: readonly PlannedAction[]): GraphStageSpec[] {
  const nextModel = modelSeq + actions.length + 1;
  const parallel = agent.parallelToolCalls;
  const tools = actions.map((a, i): GraphStageSpec => {
    const seq = modelSeq + 1 + i;
    const first = i === 0;
    return {
      seq,
      name: a.callId,
      step: a.callId,
      tool: a.tool.name,
      toolClass: a.tool.class.name,
      leaseMs: a.tool.class.leaseMs,
      timeoutMs: a.tool.class.timeoutMs,
      maxDurationMs: a.tool.class.maxDurationMs,
      maxAttempts: a.tool.retry.maxAttempts,
      state: parallel || first ? 'queued' : 'pending',
      deps: parallel || first ? [modelSeq] : [seq - 1],
      nextSeqs: parallel || i === actions.length - 1 ? [nextModel] : [seq + 1],
      depsLeft: parallel || first ? 0 : 1,
      continueOnError: agent.onToolError === 'tell_model',
      sink: null,
      input: a.input,
    };
  });
  const c = agent.model.class;
  const waitsFor = actions.length === 0 ? [modelSeq] : parallel ? tools.map((t) => t.seq) : [nextModel - 1];
  const model: GraphStageSpec = {
    seq: nextModel,
    name: 'model',
    step: 'model',
    tool: MODEL_STAGE_TOOL,
    toolClass: c.name,
    leaseMs: c.leaseMs,
    timeoutMs: c.timeoutMs,
    maxDurationMs: c.maxDurationMs,
    maxAttempts: c.retry.maxAttempts,
    state: actions.length === 0 ? 'queued' : 'pending',
    deps: waitsFor,
    nextSeqs: [],
    depsLeft: actions.length === 0 ? 0 : waitsFor.length,
    continueOnError: false,
    sink: null,
    input: {},
  };
  return [...tools, model];
}
