import type { Workflow } from '../definitions/types.js';
import { InvalidDefinitionError, InvalidInputError } from '../errors.js';
import type { StageSpec } from '../store/index.js';
import { assertWaitsRunnable } from './waits.js';

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
 * The run graph's store side (joins, skips, maps, child runs) is not in this version yet: a
 * workflow that uses it (or an agent offered a workflow as a tool) is refused at submit, with
 * nothing written, rather than run as a sequence.
 */
export function assertRunnable(workflow: Workflow): void {
  assertWaitsRunnable(workflow);
  const childTool = workflow.agent?.tools.findIndex((t) => t.childWorkflow) ?? -1;
  if (!workflow.graph && childTool < 0) return;
  const what = workflow.graph
    ? 'the run graph (after, when, map, child runs or continueOnError)'
    : 'a workflow as an agent tool (a child run)';
  throw new InvalidDefinitionError(
    `workflow ${workflow.name} uses ${what}, which this version defines and checks but cannot run yet`,
    workflow.graph ? `workflow[${workflow.name}].steps` : `agent[${workflow.name}].tools[${childTool}]`,
    { reason: 'graph_not_runnable' },
  );
}

/**
 * A static workflow's plan: one stage per step, each with the lease, timeout and retry budget
 * of its tool's class (never from input or a model). The first stage's input is computed now;
 * the others' when the stage before them finishes.
 */
export function planStaticRun(workflow: Workflow, input: unknown): StageSpec[] {
  assertRunnable(workflow);
  const concurrency = concurrencyOf(workflow, input);
  return workflow.steps.map((step, i) => {
    const cls = step.tool.class;
    return {
      name: step.name,
      tool: step.tool.name,
      toolClass: cls.name,
      leaseMs: cls.leaseMs,
      timeoutMs: cls.timeoutMs,
      maxDurationMs: cls.maxDurationMs,
      maxAttempts: step.tool.retry.maxAttempts,
      ...concurrency,
      ...(i === 0 ? { input: step.input ? (step.input({ input, results: {} }) ?? null) : input } : {}),
    };
  });
}
