import { createHash } from 'node:crypto';
import { z } from 'zod';
import { InvalidDefinitionError } from '../errors.js';
import { positiveDurationSchema } from './duration.js';
import { prioritySchema } from './priority.js';
import { canonicalJson, toolClassFingerprint, toolFingerprint, versionField } from './fingerprint.js';
import { isTool, isToolClass, zodSchemaField } from './guards.js';
import { WORKFLOW_NAME, workflowVersionSchema } from './workflow.js';
import type { AgentSpec, Duration, Tool, ToolClass, Workflow } from './types.js';
import { definitionPath, parseDefinition } from './validate.js';
import { AGENT_SLEEP_TOOL_NAME, DEFAULT_AGENT_SLEEP_MAX_MS, allowSleepSchema } from './waits.js';
import { CONTROL_CLASS } from './builtin.js';

/** The stage tool name of a model call (not a valid tool name, so it can never clash with one). */
export const MODEL_STAGE_TOOL = '$model';

/** Tool failures told to the model in one run, at most, unless the agent says otherwise. */
export const DEFAULT_MAX_TOOL_ERRORS = 5;

export const agentOptionsSchema = z.strictObject({
  name: z.string().regex(WORKFLOW_NAME, 'must be a letter then up to 63 letters, digits, "_" or "-"'),
  version: workflowVersionSchema.optional(),
  input: zodSchemaField,
  model: z.strictObject({
    name: z.string().min(1).max(200),
    class: z.custom<ToolClass>(isToolClass, { message: 'not a tool class: pass one made by defineToolClass' }),
    baseURL: z.url().optional(),
    apiKey: z.string().min(1).optional(),
    temperature: z.number().min(0).max(2).optional(),
    pricing: z.strictObject({ inputPerMillion: z.number().min(0).max(1e6), outputPerMillion: z.number().min(0).max(1e6) }).optional(),
    stream: z.boolean().optional(),
  }),
  instructions: z.string().min(1).max(100_000),
  tools: z.array(z.custom<Tool>(isTool, { message: 'not a tool: pass tools made by defineTool' })).min(1),
  maxSteps: z.int().min(1).max(1000).default(10),
  maxReplans: z.int().min(0).max(100).default(2),
  maxActions: z.int().min(1).max(100).default(10),
  parallelToolCalls: z.boolean().default(true),
  onToolError: z.enum(['tell_model', 'fail']).default('tell_model'),
  maxToolErrors: z.int().min(0).max(1000).default(DEFAULT_MAX_TOOL_ERRORS),
  deadline: positiveDurationSchema.optional(),
  priority: prioritySchema.optional(),
  allowSleep: allowSleepSchema.optional(),
  budget: z
    .strictObject({ maxTokens: z.int().min(1).max(1e12).optional(), maxCost: z.number().positive().max(1e9).optional() })
    .refine((b) => b.maxTokens !== undefined || b.maxCost !== undefined, { message: 'set maxTokens, maxCost or both' })
    .optional(),
});

export interface AgentOptions<I> {
  name: string;
  /** Default 1; see WorkflowOptions.version. */
  version?: number;
  input: z.ZodType<I>;
  model: {
    name: string;
    class: ToolClass;
    baseURL?: string;
    apiKey?: string;
    temperature?: number;
    /** Price per million tokens: each model stage's cost is computed from its usage, and summed per run. */
    pricing?: { inputPerMillion: number; outputPerMillion: number };
    /** Stream the answer's tokens to the run's watchers as they arrive (the answer is still persisted once). */
    stream?: boolean;
  };
  instructions: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  tools: Tool<any, any>[];
  /** Model calls in one run, at most (default 10). */
  maxSteps?: number;
  /** Invalid action lists sent back to the model, at most (default 2). */
  maxReplans?: number;
  /** Tool calls in one answer, at most (default 10). */
  maxActions?: number;
  /** The priority of its runs when the submitter gives none (README "Priorities"); default 0. */
  priority?: number;
  /** The tool calls of one answer run as parallel stages (default true); the next model call waits for all of them. */
  parallelToolCalls?: boolean;
  /** A tool that fails after its retries: told to the model as the tool's answer ('tell_model', default) or fails the run ('fail'). */
  onToolError?: 'tell_model' | 'fail';
  /** Tool failures told to the model in one run, at most (default 5); one more fails the run with too_many_tool_errors. */
  maxToolErrors?: number;
  deadline?: Duration;
  /**
   * Offer the model the built-in `sleep` tool (issue 10): its call waits without a lease, like a
   * sleep step. true: up to 7 days per call; `{ max }`: up to that. Default: not offered.
   */
  allowSleep?: boolean | { max: Duration };
  /**
   * Limits on the run's model usage (tokens in + out, cost with model.pricing): checked before
   * each model call, never in the middle of one; a run that reached one ends `failed` with
   * budget_exceeded.
   */
  budget?: { maxTokens?: number; maxCost?: number };
}

function agentHash(name: string, version: number, agent: AgentSpec): string {
  const structure = {
    version: 1,
    agent: name,
    ...versionField(version),
    model: { name: agent.model.name, class: toolClassFingerprint(agent.model.class) },
    instructions: createHash('sha256').update(agent.instructions).digest('hex'),
    tools: agent.tools.map(toolFingerprint),
    maxSteps: agent.maxSteps,
    maxReplans: agent.maxReplans,
    maxActions: agent.maxActions,
    // Only when not the default, so the hashes of agents that do not set them (and their runs) stay what they were.
    ...(agent.parallelToolCalls ? {} : { parallelToolCalls: false }),
    ...(agent.onToolError === 'tell_model' ? {} : { onToolError: agent.onToolError }),
    ...(agent.maxToolErrors === DEFAULT_MAX_TOOL_ERRORS ? {} : { maxToolErrors: agent.maxToolErrors }),
    ...(agent.sleep ? { sleep: { maxMs: agent.sleep.maxMs } } : {}),
    // A budget and a price decide how a run ends, so they count (only when set: other hashes stay). `stream` does not.
    ...(agent.budget ? { budget: agent.budget } : {}),
    ...(agent.model.pricing ? { pricing: agent.model.pricing } : {}),
  };
  return createHash('sha256').update(canonicalJson(structure)).digest('hex');
}

/**
 * An agent: a model proposes tool calls (the action list), Ratchet's planner validates the
 * whole list against the allow-list and each tool's zod input, and persists them as stages —
 * each with its own idempotency key and the lease, timeout and retry policy of its tool's
 * class, never anything the model says. The model call is itself a stage of `model.class`,
 * so its answer is persisted once.
 */
export function defineAgent<I>(options: AgentOptions<I>): Workflow<I> {
  const where = definitionPath('agent', (options as { name?: unknown } | null)?.name);
  const o = parseDefinition(agentOptionsSchema, options, where);
  const names = new Map<string, number>();
  o.tools.forEach((t, i) => {
    const earlier = names.get(t.name);
    if (earlier !== undefined)
      throw new InvalidDefinitionError(
        `tool name "${t.name}" is offered twice (tools[${earlier}] and tools[${i}])`,
        `${where}.tools[${i}]`,
      );
    names.set(t.name, i);
  });
  const sleepIdx = names.get(AGENT_SLEEP_TOOL_NAME);
  if (o.allowSleep && sleepIdx !== undefined) {
    throw new InvalidDefinitionError(
      `tools[${sleepIdx}] is named "${AGENT_SLEEP_TOOL_NAME}", the built-in tool allowSleep offers; rename it or drop allowSleep`,
      `${where}.tools[${sleepIdx}]`,
    );
  }
  const sleep =
    o.allowSleep === undefined || o.allowSleep === false
      ? null
      : Object.freeze({ maxMs: o.allowSleep === true ? DEFAULT_AGENT_SLEEP_MAX_MS : o.allowSleep.max });
  if (o.budget?.maxCost !== undefined && !o.model.pricing)
    throw new InvalidDefinitionError('budget.maxCost needs model.pricing (a cost is computed from it)', `${where}.budget.maxCost`);
  const agent: AgentSpec = Object.freeze({
    model: Object.freeze({
      name: o.model.name,
      class: o.model.class,
      baseURL: o.model.baseURL ?? null,
      apiKey: o.model.apiKey ?? null,
      temperature: o.model.temperature ?? null,
      pricing: o.model.pricing ? Object.freeze({ ...o.model.pricing }) : null,
      stream: o.model.stream ?? false,
    }),
    instructions: o.instructions,
    tools: Object.freeze([...o.tools]),
    maxSteps: o.maxSteps,
    maxReplans: o.maxReplans,
    maxActions: o.maxActions,
    parallelToolCalls: o.parallelToolCalls,
    onToolError: o.onToolError,
    maxToolErrors: o.maxToolErrors,
    sleep,
    budget: o.budget ? Object.freeze({ maxTokens: o.budget.maxTokens ?? null, maxCost: o.budget.maxCost ?? null }) : null,
  });
  return Object.freeze({
    kind: 'workflow',
    name: o.name,
    version: o.version ?? 1,
    input: options.input,
    steps: Object.freeze([]),
    deadlineMs: o.deadline ?? null,
    priority: o.priority ?? 0,
    hash: agentHash(o.name, o.version ?? 1, agent),
    concurrencyKey: null,
    agent,
    graph: false,
  });
}

/** Every tool a workflow may run: its steps' tools, or an agent's allow-list. */
export function toolsOf(w: Workflow): readonly Tool[] {
  return w.agent ? w.agent.tools : w.steps.map((s) => s.tool);
}

/** Every tool class a workflow's stages may use (an agent's model class included). */
export function classesOf(w: Workflow): ToolClass[] {
  const classes = toolsOf(w).map((t) => t.class);
  // An agent offered the built-in sleep tool (issue 10) runs its calls in the control class.
  return w.agent ? [...classes, w.agent.model.class, ...(w.agent.sleep ? [CONTROL_CLASS] : [])] : classes;
}
