import type { ChildWorkflowSpec, Workflow } from '../definitions/types.js';
import { decideAtClaim, type ClaimDecision, type PersistedStage } from './decide.js';
import { decideFailure, type FailedStage } from './failure.js';
import { linearSuccessor, type GraphStageSpec } from './graph.js';

/**
 * How a claimed stage of the run graph ends, pure: what the store writes in the finish
 * statement (fenced as today). The store's settle fragment then does the join (successors'
 * counters), the run's end (its sinks' counter) and the group failure.
 */
export type GraphFinish =
  | { outcome: 'succeeded'; result: unknown }
  | { outcome: 'skipped'; reason: 'when_false' | 'deps_skipped' }
  /** A map stage waits for its items (inserted with this finish; its counter = their number). */
  | { outcome: 'waiting'; waitFor: number; plan: GraphStageSpec[] }
  /** A child-run stage waits for the child run the store inserts with this finish (keyed by the stage). */
  | { outcome: 'waiting'; startChild: { workflow: ChildWorkflowSpec; input: unknown } }
  /** A failure for good kept as a value (`{ ok: false, error }` for later steps): counts as done for the join. */
  | { outcome: 'failed'; error: unknown; asValue: true }
  /** A failure for good that fails the run (with `runError`) and cancels every other unended stage, child runs included. */
  | { outcome: 'failed'; error: unknown; asValue: false; runError: unknown }
  /** Nothing ended: the stage goes back (no attempt spent). */
  | { outcome: 'hand_back' }
  /** Issue 10: the stage waits without a lease (a sleep, a signal, a person), through beginWait rather than a finish. */
  | { outcome: 'begin_wait'; wait: Extract<ClaimDecision, { kind: 'begin_wait' }> };

/** How the attempt itself ended, when the planner let a tool run (after decideRetry said "no retry" for a failure). */
export type AttemptEnd = { kind: 'succeeded'; output: unknown } | { kind: 'failed_for_good'; error: unknown };

/**
 * The finish of a stage, from the claim's decision (and, when it ran a tool, how the tool
 * ended). A planner failure (input, when, items, map bound, child outcome) and a tool's failure
 * for good go through the same group-failure rule.
 */
export function settleStage(
  workflow: Workflow,
  stage: FailedStage,
  decision: ClaimDecision,
  attempt?: AttemptEnd,
  toolErrorsSoFar = 0,
): GraphFinish {
  switch (decision.kind) {
    case 'run':
      if (!attempt) throw new Error('settleStage: a stage that ran a tool needs how the attempt ended');
      return attempt.kind === 'succeeded'
        ? { outcome: 'succeeded', result: attempt.output ?? null }
        : failure(workflow, stage, attempt.error, toolErrorsSoFar);
    case 'skip':
      return { outcome: 'skipped', reason: decision.reason };
    case 'done':
      return { outcome: 'succeeded', result: decision.result };
    case 'expand':
      return { outcome: 'waiting', waitFor: decision.items.length, plan: decision.items };
    case 'start_child':
      return { outcome: 'waiting', startChild: { workflow: decision.workflow, input: decision.input } };
    case 'wait':
      return { outcome: 'hand_back' };
    case 'begin_wait':
      return { outcome: 'begin_wait', wait: decision };
    case 'fail':
      return failure(workflow, stage, decision.error, toolErrorsSoFar);
  }
}

function failure(workflow: Workflow, stage: FailedStage, error: unknown, toolErrorsSoFar: number): GraphFinish {
  const d = decideFailure(workflow, stage, toolErrorsSoFar);
  if (d.kind === 'value') return { outcome: 'failed', error, asValue: true };
  return { outcome: 'failed', error, asValue: false, runError: d.error ?? error };
}

/**
 * The fast path's input: when `seq` has a linear successor (it waits for this stage alone), its
 * claim-time decision computed now with this stage's fresh result, so the finish can claim it
 * for this worker with its input. Only a `run` decision qualifies (a skip, a map or a child run
 * is decided by its own claim); null otherwise, and the successor is queued and woken.
 */
export function fastPathInput(
  workflow: Workflow,
  q: { runId: string; runInput: unknown; seq: number; stages: readonly PersistedStage[] },
  result: unknown,
): { seq: number; input: unknown } | null {
  if (workflow.agent) return null;
  const next = linearSuccessor(workflow, q.seq);
  if (next === null || workflow.steps[next - 1]!.kind !== 'tool') return null;
  const stages = q.stages.map((s) => (s.seq === q.seq ? { ...s, state: 'succeeded', result } : s));
  if (!stages.some((s) => s.seq === q.seq)) throw new Error(`stage ${q.seq} is not among the run's stages`);
  try {
    const d = decideAtClaim({ workflow, runId: q.runId, runInput: q.runInput, seq: next, stages });
    return d.kind === 'run' ? { seq: next, input: d.input } : null;
  } catch {
    return null; // its own claim will say what is wrong
  }
}
