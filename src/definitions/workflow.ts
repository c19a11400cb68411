import { z } from 'zod';
import { InvalidDefinitionError } from '../errors.js';
import { positiveDurationSchema } from './duration.js';
import { prioritySchema } from './priority.js';
import { workflowHash } from './fingerprint.js';
import { CHILD_RUN_TOOL, SIGNAL_TOOL, SLEEP_TOOL } from './builtin.js';
import { waitDurationSchema, waitForSignalSchema } from './waits.js';
import { checkGraph, resolveAfter } from './graph.js';
import { functionField, isTool, isWorkflow, zodSchemaField } from './guards.js';
import { TOOL_NAME } from './tool.js';
import { nonJsonParts } from './json-schema.js';
import type {
  ChildWorkflowSpec,
  Duration,
  MapSpec,
  SignalSpec,
  SleepSpec,
  Step,
  StepInputArgs,
  Tool,
  ToolClass,
  Workflow,
} from './types.js';
import { definitionPath, parseDefinition } from './validate.js';

/** Workflow and step names follow the tool-name rule (they appear in URLs, CLI arguments and `results`). */
export const WORKFLOW_NAME = TOOL_NAME;
const NAME_RULE = 'must be a letter then up to 63 letters, digits, "_" or "-"';
/** Steps in one workflow, at most (a map's item stages are numbered after its own stage: see planner/map.ts). */
export const MAX_STEPS = 2000;
/** A map's list is at most this long unless the step says otherwise (`map.maxItems`). */
export const MAP_DEFAULT_MAX_ITEMS = 10_000;
/** The highest `map.maxItems` a step may set. */
export const MAP_MAX_ITEMS_LIMIT = 999_999;

/** A declared workflow version: a positive integer; the highest loaded one is the newest. */
export const workflowVersionSchema = z.int().min(1).max(1_000_000);

/** What every kind of step may say about its place in the graph. */
const graphFields = {
  name: z.string().regex(WORKFLOW_NAME, NAME_RULE).optional(),
  after: z.array(z.string().regex(WORKFLOW_NAME, NAME_RULE)).max(MAX_STEPS).optional(),
  when: functionField.optional(),
  continueOnError: z.boolean().optional(),
};

export const toolStepSchema = z.strictObject({
  tool: z.custom<Tool>(isTool, { message: 'not a tool: pass a tool made by defineTool' }),
  input: functionField.optional(),
  ...graphFields,
});

export const mapStepSchema = z.strictObject({
  map: z.strictObject({
    items: functionField,
    tool: z.custom<Tool>(isTool, { message: 'not a tool: pass a tool made by defineTool' }),
    input: functionField.optional(),
    maxParallel: z.int().min(1).max(100_000).optional(),
    maxItems: z.int().min(0).max(MAP_MAX_ITEMS_LIMIT, `must be at most ${MAP_MAX_ITEMS_LIMIT}`).optional(),
  }),
  ...graphFields,
});

export const childStepSchema = z.strictObject({
  workflow: z.union([z.string().regex(WORKFLOW_NAME, NAME_RULE), z.custom<Workflow>(isWorkflow, { message: 'not a workflow' })]),
  version: workflowVersionSchema.optional(),
  input: functionField.optional(),
  ...graphFields,
});

/** `{ sleep: '10m' }` or `{ until: ({ input, results }) => Date }` (issue 10): exactly one of them. */
export const sleepStepSchema = z.strictObject({
  sleep: waitDurationSchema.optional(),
  until: functionField.optional(),
  ...graphFields,
});

/** `{ waitForSignal: { name, schema, timeout, onTimeout? } }` (issue 10). */
export const signalStepSchema = z.strictObject({
  waitForSignal: waitForSignalSchema,
  ...graphFields,
});

export const workflowOptionsSchema = z.strictObject({
  name: z.string().regex(WORKFLOW_NAME, NAME_RULE),
  version: workflowVersionSchema.optional(),
  input: zodSchemaField,
  // Each step is checked by the schema of its kind (toolStepSchema, mapStepSchema, childStepSchema), so errors name its own fields.
  steps: z.array(z.unknown()).min(1, 'a workflow needs at least one step').max(MAX_STEPS, `a workflow has at most ${MAX_STEPS} steps`),
  deadline: positiveDurationSchema.optional(),
  priority: prioritySchema.optional(),
  concurrencyKey: z.strictObject({ key: functionField, limit: z.int().min(1).max(100_000) }).optional(),
});

/** What every kind of step may say about its place in the graph. */
interface GraphOptions<I = unknown> {
  /** Defaults to the tool's (map: the item tool's; child run: the workflow's) name; a tool used twice needs explicit names. */
  name?: string;
  /** The steps this one waits for (fan-in); default: the previous step. `[]` starts it with the run (fan-out). */
  after?: string[];
  /** A false answer skips the step (state `skipped`); steps that wait only for skipped steps are skipped too. */
  when?: (args: StepInputArgs<I>) => boolean;
  /** Its failure for good becomes `{ ok: false, error }` in `results`, instead of failing the run and cancelling the rest. */
  continueOnError?: boolean;
}

export interface ToolStepOptions<I = unknown> extends GraphOptions<I> {
  // Tool<any, any>: a Tool<{ url: string }> is not assignable to Tool<unknown> (its functions take I).
  tool: Tool<any, any>;
  /** Computes the tool's input from the run's input and earlier results; without it the run's input is passed on. */
  input?: (args: StepInputArgs<I>) => unknown;
}

export interface MapStepOptions<I = unknown> extends GraphOptions<I> {
  map: {
    /** The list, from the run's input and earlier results. */
    items: (args: StepInputArgs<I>) => unknown[];
    /** The tool each item runs (one stage per item, each with its own idempotency key). */
    tool: Tool<any, any>;
    /** Each item's tool input; default: the item. */
    input?: (item: any, index: number, args: StepInputArgs<I>) => unknown;
    /** At most this many items hold a lease at once for one run, across all workers. */
    maxParallel?: number;
    /** A longer list fails the step with map_too_large (default 10,000). */
    maxItems?: number;
  };
}

export interface ChildStepOptions<I = unknown> extends GraphOptions<I> {
  /** The workflow (or agent) a child run starts: by name (the newest loaded version), or the definition itself. */
  workflow: string | Workflow<any>;
  /** The version to start (by name only). */
  version?: number;
  /** The child run's input; without it the run's input is passed on. */
  input?: (args: StepInputArgs<I>) => unknown;
}

/** A step that waits, holding no lease: `sleep` a duration, or `until` a time (one of them; name defaults to "sleep"). */
export interface SleepStepOptions<I = unknown> extends GraphOptions<I> {
  /** An ms string ("10m", "7d") or milliseconds, counted from when the step's turn comes, by the database clock. */
  sleep?: Duration;
  /** The time to wake at, from the run's input and earlier results; a time already past wakes at once. */
  until?: (args: StepInputArgs<I>) => Date;
}

/** A step that waits, holding no lease, for `POST /v1/runs/:id/signals/:name` (name defaults to the signal's). */
export interface SignalStepOptions<I = unknown> extends GraphOptions<I> {
  waitForSignal: {
    name: string;
    /** The payload's schema; the payload becomes the step's output. */
    schema: z.ZodType;
    /** No signal within this long: the stage fails with `signal_timeout`, unless `onTimeout` gives its output. */
    timeout: Duration;
    onTimeout?: (args: StepInputArgs<I>) => unknown;
  };
}

export type StepOptions<I = unknown> =
  | ToolStepOptions<I>
  | MapStepOptions<I>
  | ChildStepOptions<I>
  | SleepStepOptions<I>
  | SignalStepOptions<I>;

export interface WorkflowOptions<I> {
  name: string;
  /** Default 1. Keep the old version loaded beside a new one until its runs have finished. */
  version?: number;
  input: z.ZodType<I>;
  steps: StepOptions<I>[];
  /** A run deadline relative to submit. */
  deadline?: Duration;
  /** The priority of its runs when the submitter gives none (README "Priorities"); default 0. */
  priority?: number;
  /** Bound the stages running at once per key (a user, a tenant): `{ key: (input) => input.userId, limit: 1 }`. */
  concurrencyKey?: { key: (input: I) => string; limit: number };
}

type ParsedStep =
  | { kind: 'tool'; o: z.output<typeof toolStepSchema> }
  | { kind: 'map'; o: z.output<typeof mapStepSchema> }
  | { kind: 'workflow'; o: z.output<typeof childStepSchema> }
  | { kind: 'sleep'; o: z.output<typeof sleepStepSchema> }
  | { kind: 'signal'; o: z.output<typeof signalStepSchema> };

/** Each step by the schema of its kind: `map` makes a map step, `workflow` a child-run step, else a tool step. */
function parseStep(value: unknown, at: string): ParsedStep {
  const has = (key: string) => typeof value === 'object' && value !== null && key in value;
  if (has('map')) return { kind: 'map', o: parseDefinition(mapStepSchema, value, at) };
  if (has('workflow')) return { kind: 'workflow', o: parseDefinition(childStepSchema, value, at) };
  if (has('waitForSignal')) {
    const o = parseDefinition(signalStepSchema, value, at);
    // The payload is stored as the stage's output (JSON) and handed to later steps from there.
    const bad = nonJsonParts(o.waitForSignal.schema);
    if (bad.length > 0) {
      throw new InvalidDefinitionError(
        `the signal's schema gives what JSON would change: ${bad.map((b) => `${b.type} at ${b.path}`).join(', ')} (the payload is stored as JSON)`,
        `${at}.waitForSignal.schema`,
        { parts: bad },
      );
    }
    return { kind: 'signal', o };
  }
  if (has('sleep') || has('until')) {
    const o = parseDefinition(sleepStepSchema, value, at);
    if ((o.sleep === undefined) === (o.until === undefined)) {
      throw new InvalidDefinitionError('a sleep step takes exactly one of `sleep` (a duration) and `until` (a function)', `${at}.sleep`);
    }
    return { kind: 'sleep', o };
  }
  return { kind: 'tool', o: parseDefinition(toolStepSchema, value, at) };
}

function defaultName(p: ParsedStep): string {
  if (p.kind === 'tool') return p.o.tool.name;
  if (p.kind === 'map') return p.o.map.tool.name;
  if (p.kind === 'sleep') return 'sleep';
  if (p.kind === 'signal') return p.o.waitForSignal.name;
  return typeof p.o.workflow === 'string' ? p.o.workflow : p.o.workflow.name;
}

/** The resolved, frozen steps (dependencies resolved and checked). */
function buildSteps(parsed: readonly ParsedStep[], where: string): Step[] {
  const names = parsed.map((p) => p.o.name ?? defaultName(p));
  const nodes = parsed.map((p, i) => ({
    name: names[i]!,
    conditional: p.o.when !== undefined,
    ...(p.o.after ? { after: p.o.after } : {}),
  }));
  const after = resolveAfter(nodes);
  const steps = parsed.map((p, i): Step => {
    const common = {
      name: names[i]!,
      after: Object.freeze(after[i]!),
      continueOnError: p.o.continueOnError ?? false,
      ...(p.o.when ? { when: p.o.when as (args: StepInputArgs) => boolean } : {}),
    };
    if (p.kind === 'tool') {
      return Object.freeze({
        ...common,
        kind: 'tool',
        tool: p.o.tool,
        ...(p.o.input ? { input: p.o.input as (args: StepInputArgs) => unknown } : {}),
      });
    }
    if (p.kind === 'map') {
      const m = p.o.map;
      const map: MapSpec = Object.freeze({
        items: m.items as MapSpec['items'],
        maxParallel: m.maxParallel ?? null,
        maxItems: m.maxItems ?? MAP_DEFAULT_MAX_ITEMS,
        ...(m.input ? { input: m.input as NonNullable<MapSpec['input']> } : {}),
      });
      return Object.freeze({ ...common, kind: 'map', tool: m.tool, map });
    }
    if (p.kind === 'sleep') {
      const sleep: SleepSpec = Object.freeze({
        ms: p.o.sleep ?? null,
        ...(p.o.until ? { until: p.o.until as NonNullable<SleepSpec['until']> } : {}),
      });
      return Object.freeze({ ...common, kind: 'sleep', tool: SLEEP_TOOL, sleep });
    }
    if (p.kind === 'signal') {
      const w = p.o.waitForSignal;
      const signal: SignalSpec = Object.freeze({
        name: w.name,
        schema: w.schema,
        timeoutMs: w.timeout,
        ...(w.onTimeout ? { onTimeout: w.onTimeout as NonNullable<SignalSpec['onTimeout']> } : {}),
      });
      return Object.freeze({ ...common, kind: 'signal', tool: SIGNAL_TOOL, signal });
    }
    const w = p.o.workflow;
    if (typeof w !== 'string' && p.o.version !== undefined) {
      throw new InvalidDefinitionError(
        'version goes with a workflow named by a string; a definition carries its own',
        `${where}.steps[${i}].version`,
      );
    }
    const workflow: ChildWorkflowSpec = Object.freeze(
      typeof w === 'string' ? { name: w, version: p.o.version ?? null } : { name: w.name, version: w.version },
    );
    return Object.freeze({
      ...common,
      kind: 'workflow',
      tool: CHILD_RUN_TOOL,
      workflow,
      ...(p.o.input ? { input: p.o.input as (args: StepInputArgs) => unknown } : {}),
    });
  });
  checkNames(steps, where);
  checkSignalNames(steps, where);
  checkGraph(nodes, after, where);
  return steps;
}

/** A plain sequence of tool calls: no graph feature used (its hash and plan stay what they were). */
function isLinear(parsed: readonly ParsedStep[]): boolean {
  return parsed.every((p) => p.kind === 'tool' && p.o.after === undefined && p.o.when === undefined && p.o.continueOnError === undefined);
}

/**
 * Refuses two signal steps waiting for one signal name: a signal is delivered to the run's one
 * wait of that name (or kept for it), never left to a choice between two.
 */
function checkSignalNames(steps: readonly Step[], where: string): void {
  const seen = new Map<string, number>();
  steps.forEach((step, i) => {
    if (!step.signal) return;
    const earlier = seen.get(step.signal.name);
    if (earlier !== undefined) {
      throw new InvalidDefinitionError(
        `signal "${step.signal.name}" is waited for by steps[${earlier}] and steps[${i}]; give each wait its own signal name`,
        `${where}.steps[${i}].waitForSignal.name`,
        { signal: step.signal.name },
      );
    }
    seen.set(step.signal.name, i);
  });
}

/** Refuses two steps with one name, and two different tools (or classes) with one name. */
function checkNames(steps: readonly Step[], where: string): void {
  const stepAt = new Map<string, number>();
  const tools = new Map<string, { tool: Tool; at: number }>();
  const classes = new Map<string, { cls: ToolClass; at: number }>();
  steps.forEach((step, i) => {
    const earlier = stepAt.get(step.name);
    if (earlier !== undefined) {
      throw new InvalidDefinitionError(
        `step name "${step.name}" is used by steps[${earlier}] and steps[${i}]; ` + 'a tool used twice needs an explicit name on each step',
        `${where}.steps[${i}].name`,
        { step: step.name },
      );
    }
    stepAt.set(step.name, i);
    const tool = tools.get(step.tool.name);
    if (tool && tool.tool !== step.tool) {
      throw new InvalidDefinitionError(
        `two different tools are named "${step.tool.name}" (steps[${tool.at}] and steps[${i}])`,
        `${where}.steps[${i}].tool`,
        { tool: step.tool.name },
      );
    }
    tools.set(step.tool.name, { tool: step.tool, at: i });
    const cls = classes.get(step.tool.class.name);
    if (cls && cls.cls !== step.tool.class) {
      throw new InvalidDefinitionError(
        `two different tool classes are named "${step.tool.class.name}" (steps[${cls.at}] and steps[${i}])`,
        `${where}.steps[${i}].tool.class`,
        { toolClass: step.tool.class.name },
      );
    }
    classes.set(step.tool.class.name, { cls: step.tool.class, at: i });
  });
}

/**
 * A static workflow: a graph of steps (a sequence by default), each stage's result committed
 * before any stage that waits for it starts. Refuses, naming the path, a cycle, an `after` that
 * names no step, a step nothing leads to, a map without items, a bound out of range.
 */
export function defineWorkflow<I>(options: WorkflowOptions<I>): Workflow<I> {
  const where = definitionPath('workflow', (options as { name?: unknown } | null)?.name);
  const o = parseDefinition(workflowOptionsSchema, options, where);
  const parsed = o.steps.map((s, i) => parseStep(s, `${where}.steps[${i}]`));
  const steps = buildSteps(parsed, where);
  const graph = !isLinear(parsed);
  if (o.concurrencyKey) {
    const bounded = steps.findIndex((s) => s.map?.maxParallel != null);
    if (bounded >= 0) {
      throw new InvalidDefinitionError(
        "a map's maxParallel cannot be combined with the workflow's concurrencyKey yet (a stage holds one " +
          'concurrency key); drop one of them',
        `${where}.steps[${bounded}].map.maxParallel`,
      );
    }
  }
  return Object.freeze({
    kind: 'workflow',
    name: o.name,
    version: o.version ?? 1,
    input: options.input,
    steps: Object.freeze(steps),
    deadlineMs: o.deadline ?? null,
    priority: o.priority ?? 0,
    hash: workflowHash(o.name, steps, o.version ?? 1, graph),
    concurrencyKey: options.concurrencyKey ? { key: options.concurrencyKey.key, limit: o.concurrencyKey!.limit } : null,
    agent: null,
    graph,
  });
}
