import { z } from 'zod';
import { InvalidDefinitionError } from '../errors.js';
import { positiveDurationSchema } from './duration.js';
import { prioritySchema } from './priority.js';
import { workflowHash } from './fingerprint.js';
import { functionField, isTool, zodSchemaField } from './guards.js';
import { TOOL_NAME } from './tool.js';
import type { Duration, Step, StepInputArgs, Tool, ToolClass, Workflow } from './types.js';
import { definitionPath, parseDefinition } from './validate.js';

/** Workflow and step names follow the tool-name rule (they appear in URLs, CLI arguments and `results`). */
export const WORKFLOW_NAME = TOOL_NAME;
const NAME_RULE = 'must be a letter then up to 63 letters, digits, "_" or "-"';

const stepSchema = z.strictObject({
  tool: z.custom<Tool>(isTool, { message: 'not a tool: pass a tool made by defineTool' }),
  name: z.string().regex(WORKFLOW_NAME, NAME_RULE).optional(),
  input: functionField.optional(),
});

/** A declared workflow version: a positive integer; the highest loaded one is the newest. */
export const workflowVersionSchema = z.int().min(1).max(1_000_000);

export const workflowOptionsSchema = z.strictObject({
  name: z.string().regex(WORKFLOW_NAME, NAME_RULE),
  version: workflowVersionSchema.optional(),
  input: zodSchemaField,
  steps: z.array(stepSchema).min(1, 'a workflow needs at least one step'),
  deadline: positiveDurationSchema.optional(),
  priority: prioritySchema.optional(),
  concurrencyKey: z.strictObject({ key: functionField, limit: z.int().min(1).max(100_000) }).optional(),
});

export interface StepOptions {
  // Tool<any, any>: a Tool<{ url: string }> is not assignable to Tool<unknown> (its functions take I).
  tool: Tool<any, any>;
  /** Defaults to the tool's name; a tool used twice needs explicit names. */
  name?: string;
  /** Computes the tool's input from the run's input and earlier results; without it the run's input is passed on. */
  input?: (args: StepInputArgs) => unknown;
}

export interface WorkflowOptions<I> {
  name: string;
  /** Default 1. Keep the old version loaded beside a new one until its runs have finished. */
  version?: number;
  input: z.ZodType<I>;
  steps: StepOptions[];
  /** A run deadline relative to submit. */
  deadline?: Duration;
  /** The priority of its runs when the submitter gives none (README "Priorities"); default 0. */
  priority?: number;
  /** Bound the stages running at once per key (a user, a tenant): `{ key: (input) => input.userId, limit: 1 }`. */
  concurrencyKey?: { key: (input: I) => string; limit: number };
}

/** Refuses two steps with one name, and two different tools (or classes) with one name. */
function checkNames(steps: readonly Step[], where: string): void {
  const stepAt = new Map<string, number>();
  const tools = new Map<string, { tool: Tool; at: number }>();
  const classes = new Map<string, { cls: ToolClass; at: number }>();
  steps.forEach((step, i) => {
    const earlier = stepAt.get(step.name);
    if (earlier !== undefined) {
      throw new InvalidDefinitionError(`step name "${step.name}" is used by steps[${earlier}] and steps[${i}]; ` +
        'a tool used twice needs an explicit name on each step', `${where}.steps[${i}].name`, { step: step.name });
    }
    stepAt.set(step.name, i);
    const tool = tools.get(step.tool.name);
    if (tool && tool.tool !== step.tool) {
      throw new InvalidDefinitionError(`two different tools are named "${step.tool.name}" (steps[${tool.at}] and steps[${i}])`,
        `${where}.steps[${i}].tool`, { tool: step.tool.name });
    }
    tools.set(step.tool.name, { tool: step.tool, at: i });
    const cls = classes.get(step.tool.class.name);
    if (cls && cls.cls !== step.tool.class) {
      throw new InvalidDefinitionError(`two different tool classes are named "${step.tool.class.name}" (steps[${cls.at}] and steps[${i}])`,
        `${where}.steps[${i}].tool.class`, { toolClass: step.tool.class.name });
    }
    classes.set(step.tool.class.name, { cls: step.tool.class, at: i });
  });
}

/** A static workflow: its steps run one at a time, each result committed before the next starts. */
export function defineWorkflow<I>(options: WorkflowOptions<I>): Workflow<I> {
  const where = definitionPath('workflow', (options as { name?: unknown } | null)?.name);
  const o = parseDefinition(workflowOptionsSchema, options, where);
  const steps: Step[] = o.steps.map((s) => Object.freeze({
    name: s.name ?? s.tool.name,
    tool: s.tool,
    ...(s.input ? { input: s.input as (args: StepInputArgs) => unknown } : {}),
  }));
  checkNames(steps, where);
  return Object.freeze({
    kind: 'workflow',
    name: o.name,
    version: o.version ?? 1,
    input: options.input,
    steps: Object.freeze(steps),
    deadlineMs: o.deadline ?? null,
    priority: o.priority ?? 0,
    hash: workflowHash(o.name, steps, o.version ?? 1),
    concurrencyKey: options.concurrencyKey ? { key: options.concurrencyKey.key, limit: o.concurrencyKey!.limit } : null,
    agent: null,
  });
}
