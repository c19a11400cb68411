import { MODEL_STAGE_TOOL } from '../definitions/agent.js';
import type { AgentSpec, ChildWorkflowSpec, StepInputArgs, Workflow } from '../definitions/types.js';
import type { GraphErrorCode } from '../errors.js';
import { toJsonText } from '../store/json.js';
import { runGraph, type GraphNode, type GraphStageSpec } from './graph.js';
import { failedToolCalls, toolErrorsOver } from './failure.js';
import { expandMap, gatherMap } from './map.js';
import { guarded, plannerFailure, type PlannerError, type PlannerFailure } from './planner-error.js';
import { decideGate, decideAgentSleep, decideSleepStep, decideSignalStep, type StageWait, type WaitClaim } from './waits.js';
import { AGENT_SLEEP_TOOL_NAME } from '../definitions/waits.js';

export type { PlannerError } from './planner-error.js';

/** A stage of the run as persisted: what the planner decides from (never anything held in memory). */
export interface PersistedStage {
  seq: number;
  name: string;
  state: string;
  result: unknown;
  error: unknown;
  /** A map item's index and its map stage's seq (null for a step's own stage). */
  itemIndex: number | null;
  groupSeq: number | null;
  input?: unknown;
  /** The stage's tool (agents tell model calls and tool calls apart by it). */
  tool?: string;
}

/** A child run as persisted, for the parent stage that started it. */
export interface ChildRunState {
  id: string;
  state: string;
  result: unknown;
  error: unknown;
}

export interface ClaimQuestion {
  workflow: Workflow;
  runId: string;
  runInput: unknown;
  /** The claimed stage. */
  seq: number;
  /** Every stage of the run as persisted (the claimed one included). */
  stages: readonly PersistedStage[];
  /** A child-run stage's child run, once started. */
  child?: ChildRunState | null;
  /** The database's now at the claim (waits: a sleep's end, a timeout). */
  now?: Date;
  /** The stage's ratchet.waits row, if it ever waited (a sleep, a signal, an approval: issue 10). */
  wait?: StageWait | null;
}

export type ClaimDecision =
  /** Run the tool with this input. */
  | { kind: 'run'; input: unknown }
  /** The stage ends `skipped` (its successors count it as done). */
  | { kind: 'skip'; reason: 'when_false' | 'deps_skipped' }
  /** The stage fails for good (then continueOnError, or the group failure, decides what follows). */
  | PlannerFailure
  /** A map's first claim: insert these item stages; the map stage waits for them (state `waiting`, counter = their number). */
  | { kind: 'expand'; items: GraphStageSpec[] }
  /** The stage succeeds with this value without running a tool (a gathered map, an empty map, an ended child run). */
  | { kind: 'done'; result: unknown }
  /** Start the child run (keyed by this stage) and wait for it without a lease. */
  | { kind: 'start_child'; workflow: ChildWorkflowSpec; input: unknown }
  /** What this stage waits for has not ended: it goes back to waiting (no attempt should be spent). */
  | { kind: 'wait' }
  /** Issue 10: the stage waits without a lease (src/store/signals.ts beginWait): a sleep, a signal, a person's decision. */
  | WaitClaim;

const ENDED_AS_VALUE = new Set(['succeeded', 'skipped']);

/** The value a dependency's stage gives later steps: its result; `{ ok: false, error }` for a failure kept as a value; absent when skipped. */
export function valueOf(stage: PersistedStage): { present: true; value: unknown } | { present: false } {
  if (stage.state === 'succeeded') return { present: true, value: stage.result };
  if (stage.state === 'failed') return { present: true, value: { ok: false, error: stage.error } };
  return { present: false };
}

/**
 * What the steps before `node` hand it: the results of its ancestors by step name (a skipped one
 * is absent; one that failed with continueOnError is `{ ok: false, error }`). Only ancestors: they
 * have all ended when it is claimed, so every worker computes the same thing after any crash.
 */
export function resultsFor(node: GraphNode, stages: readonly PersistedStage[]): Record<string, unknown> {
  const results: Record<string, unknown> = {};
  for (const s of stages) {
    if (s.groupSeq !== null || !node.ancestors.has(s.name)) continue;
    const v = valueOf(s);
    if (v.present) results[s.name] = v.value;
  }
  return results;
}

/** A value as stored (JSON), or the step's permanent failure with `code`. */
function asJson(code: GraphErrorCode, what: string, value: unknown): { ok: true; value: unknown } | { ok: false; fail: PlannerFailure } {
  try {
    toJsonText(value ?? null, what);
    return { ok: true, value: value ?? null };
  } catch (err) {
    return { ok: false, fail: plannerFailure(code, `${what} is not JSON: ${(err as Error).message}`) };
  }
}

/**
 * The planner at claim time, pure: from the claimed stage, the persisted stages of its run and
 * the run's input, what the stage does now. In order:
 * - a map item runs with the input its expansion stored;
 * - a map stage whose items exist gathers their values in item order (or waits, if one has not ended);
 * - a child-run stage whose child exists takes the child's result or error (or waits);
 * - a stage whose dependencies were ALL skipped is skipped (mixed: it runs, the skipped ones absent from `results`);
 * - `when` false: skipped;
 * - else a tool step runs with its input, a map expands (or ends at once: `[]`, or map_too_large),
 *   a child-run step starts its child.
 * User code that throws (input, when, items) fails the stage for good with a planner error code.
 */
export function decideAtClaim(q: ClaimQuestion): ClaimDecision {
  const self = q.stages.find((s) => s.seq === q.seq);
  if (q.workflow.agent) return decideAgentStage(q.workflow.agent, q, self);
  const graph = runGraph(q.workflow);
  if (self && self.groupSeq !== null) return { kind: 'run', input: self.input ?? null };
  const node = graph.bySeq.get(q.seq);
  if (!node) throw new Error(`workflow ${q.workflow.name} has no step for stage ${q.seq}`);
  const step = node.step;

  if (step.kind === 'map') {
    const items = q.stages.filter((s) => s.groupSeq === q.seq);
    if (items.length > 0) return gatherMap(step, items);
  }
  if (step.kind === 'workflow' && q.child) return childOutcome(q.child);

  const deps = node.deps.map((d) => q.stages.find((s) => s.seq === d));
  const open = deps.findIndex((s) => !s || !(ENDED_AS_VALUE.has(s.state) || s.state === 'failed'));
  if (open >= 0) throw new Error(`stage ${q.seq} (${step.name}) was claimed before its dependency ${node.deps[open]} ended`);
  if (deps.length > 0 && deps.every((s) => s!.state === 'skipped')) return { kind: 'skip', reason: 'deps_skipped' };

  const args: StepInputArgs = { input: q.runInput, results: resultsFor(node, q.stages) };
  if (step.when) {
    const w = guarded('when_failed', `when() of step ${step.name}`, () => step.when!(args));
    if (!w.ok) return w.fail;
    if (typeof w.value !== 'boolean')
      return plannerFailure('when_failed', `when() of step ${step.name} returned ${typeof w.value}, not a boolean`);
    if (!w.value) return { kind: 'skip', reason: 'when_false' };
  }

  if (step.kind === 'map') return expandMap(q.workflow, q.runId, q.runInput, node, args);
  const now = q.now ?? new Date();
  if (step.kind === 'sleep') return decideSleepStep(step, args, now, q.wait ?? null);
  if (step.kind === 'signal') return decideSignalStep(step, args, now, q.wait ?? null, self?.error ?? null);
  const input = step.input
    ? guarded('step_input_failed', `input() of step ${step.name}`, () => step.input!(args))
    : { ok: true as const, value: q.runInput };
  if (!input.ok) return input.fail;
  const json = asJson('step_input_failed', `the input of step ${step.name}`, input.value);
  if (!json.ok) return json.fail;
  if (step.kind === 'workflow') return { kind: 'start_child', workflow: step.workflow!, input: json.value };
  if (step.tool.approval) return decideGate(step.tool, json.value, self?.input, q.wait ?? null);
  return { kind: 'run', input: json.value };
}

/**
 * An agent's stage at its claim: a model call first checks the bound on tool errors told to
 * the model (every failure of the run is persisted by now, so the bound holds exactly here); a
 * workflow tool starts its child run (with the input the planner validated when the model
 * proposed it) or takes the child's outcome; any other tool runs with its stored input.
 */
function decideAgentStage(agent: AgentSpec, q: ClaimQuestion, self: PersistedStage | undefined): ClaimDecision {
  if (!self) throw new Error(`stage ${q.seq} is not among the run's stages`);
  if (self.tool === MODEL_STAGE_TOOL) {
    const over = toolErrorsOver(agent, failedToolCalls(q.stages.map((s) => ({ tool: s.tool ?? '', state: s.state }))));
    return over ?? { kind: 'run', input: self.input ?? {} };
  }
  if (self.tool === AGENT_SLEEP_TOOL_NAME && agent.sleep)
    return decideAgentSleep(self.input ?? null, q.now ?? new Date(), agent.sleep.maxMs, q.wait ?? null);
  const tool = agent.tools.find((t) => t.name === self.tool);
  if (tool?.childWorkflow)
    return q.child ? childOutcome(q.child) : { kind: 'start_child', workflow: tool.childWorkflow, input: self.input ?? null };
  if (tool?.approval) return decideGate(tool, self.input ?? null, self.input, q.wait ?? null);
  return { kind: 'run', input: self.input ?? null };
}

const CHILD_ENDS: Record<string, GraphErrorCode> = {
  failed: 'child_run_failed',
  cancelled: 'child_run_cancelled',
  expired: 'child_run_expired',
};

/** A child-run stage after its child started: the child's result, its failure as this stage's, or wait. */
export function childOutcome(child: ChildRunState): ClaimDecision {
  if (child.state === 'succeeded') return { kind: 'done', result: child.result ?? null };
  const code = CHILD_ENDS[child.state];
  if (!code) return { kind: 'wait' };
  const reason = (child.error as { message?: unknown } | null)?.message;
  return plannerFailure(code, `child run ${child.id} ${child.state}${typeof reason === 'string' ? `: ${reason}` : ''}`, {
    childRunId: child.id,
    childError: child.error ?? null,
  });
}
