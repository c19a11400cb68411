import type { Workflow } from '../definitions/types.js';
import { InvalidInputError } from '../errors.js';
import type { StageSpec } from '../store/index.js';
import { planGraphRun } from './graph.js';

/** The run's concurrency key (from the workflow's key function), or none. */
export function concurrencyOf(
  workflow: Workflow,
  input: unknown,
): { concurrencyKey: string; concurrencyLimit: number } | Record<string, never> {
  if (!workflow.concurrencyKey) return {};
  let key: unknown;
  try {
    key = workflow.concurrencyKey.key(input);
  } catch (err) {
    throw new InvalidInputError(
      `the concurrency key of workflow ${workflow.name} could not be computed: ${(err as Error).message}`,
      'input',
    );
  }
  if (typeof key !== 'string' || key.length === 0)
    throw new InvalidInputError(`the concurrency key of workflow ${workflow.name} must be a non-empty string`, 'input');
  return { concurrencyKey: key, concurrencyLimit: workflow.concurrencyKey.limit };
}

/**
 * A static workflow's plan, as the run graph: one stage per step (seq = position), each with
 * the lease, timeout and retry budget of its tool's class (never from input or a model), what it
 * waits for and what waits for it; stages that wait for nothing are queued. A first stage without
 * `when` gets its input now (as a plain sequence always did); every other input is computed when
 * the stage is claimed, or by the finish before it on the fast path. `sinksLeft` starts the run's
 * own counter.
 */
export function planStaticRun(workflow: Workflow, input: unknown): { stages: StageSpec[]; sinksLeft: number } {
  const plan = planGraphRun(workflow, input);
  const stages = plan.stages.map((g, i): StageSpec => {
    const step = workflow.steps[i]!;
    const eager = g.deps.length === 0 && step.kind === 'tool' && !step.when;
    return {
      name: g.name,
      step: g.step,
      tool: g.tool,
      toolClass: g.toolClass,
      leaseMs: g.leaseMs,
      timeoutMs: g.timeoutMs,
      maxDurationMs: g.maxDurationMs,
      maxAttempts: g.maxAttempts,
      deps: g.deps,
      nextSeqs: g.nextSeqs,
      continueOnError: g.continueOnError,
      sink: g.sink,
      ...(g.concurrencyKey !== undefined ? { concurrencyKey: g.concurrencyKey, concurrencyLimit: g.concurrencyLimit } : {}),
      ...(eager ? { input: step.input ? (step.input({ input, results: {} }) ?? null) : input } : {}),
    };
  });
  return { stages, sinksLeft: plan.sinksLeft };
}
