import type { Workflow } from '../definitions/types.js';
import type { StageSpec } from '../store/index.js';

/**
 * A static workflow's plan: one stage per step, each with the lease, timeout and retry budget
 * of its tool's class (never from input or a model). The first stage's input is computed now;
 * the others' when the stage before them finishes.
 */
export function planStaticRun(workflow: Workflow, input: unknown): StageSpec[] {
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
      ...(i === 0 ? { input: step.input ? step.input({ input, results: {} }) ?? null : input } : {}),
    };
  });
}
