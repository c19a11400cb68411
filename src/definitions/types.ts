import type { Logger } from 'pino';
import type { z } from 'zod';

/**
 * The resolved shapes of definitions (what defineToolClass / defineTool / defineWorkflow
 * return). Durations are milliseconds here; users write `ms` strings ("90s") or numbers.
 * The model never sets any of these.
 */
export type Duration = string | number;

export interface Backoff {
  initialMs: number;
  factor: number;
  maxMs: number;
  /** 0..1: each delay is drawn from [d * (1 - jitter), d]. */
  jitter: number;
}

export interface RetryPolicy {
  /** Attempts in all, the first included (>= 1). */
  maxAttempts: number;
  backoff: Backoff;
  /** No retry is scheduled past this long after the stage's first claim. */
  maxElapsedMs: number | null;
}

export interface ToolClass {
  readonly kind: 'tool_class';
  readonly name: string;
  readonly leaseMs: number;
  readonly heartbeatMs: number;
  readonly timeoutMs: number;
  readonly maxDurationMs: number;
  readonly retry: RetryPolicy;
  /** The timing rule: leaseMs > missedHeartbeats * heartbeatMs + jitterMs. */
  readonly missedHeartbeats: number;
  readonly jitterMs: number;
  /** 'thread' runs the class's tools in a worker thread, so CPU-bound work cannot starve the lease keeper. */
  readonly isolation: 'none' | 'thread';
  /** At most this many stages of the class run at once across all workers (null: no global limit). */
  readonly concurrency: number | null;
  /** At most `max` stages of the class start in any window of `perMs`, across all workers. */
  readonly rateLimit: { max: number; perMs: number } | null;
}

export interface ToolContext {
  /** Aborts with reason 'lease_lost' | 'ownership_unknown' | 'cancelled' | 'timeout' | 'shutdown'. */
  readonly signal: AbortSignal;
  /** The attempt's fencing token, a decimal string; send it as X-Execution-Fence. */
  readonly fence: string;
  /** Stable per stage (or derived from the input by the tool); send it as Idempotency-Key. */
  readonly idempotencyKey: string;
  readonly attempt: number;
  readonly runId: string;
  readonly stageId: string;
  /** Records progress; the lease keeper extends leases on its own schedule regardless. */
  heartbeat(details?: unknown): void;
  /**
   * The gate before each irreversible request: throws synchronously when ownership is lost
   * or unknown; records `tool_request_started` with the request id.
   */
  beginEffect(requestId: string): void;
  readonly log: Logger;
  /**
   * The W3C trace context of this tool call's span (src/observability/tracing.ts): send it as
   * the `traceparent` header on the tool's requests, so the services it calls join the run's trace.
   */
  readonly traceparent?: string;
}

/** What reconcile() found out about an attempt whose outcome is unknown. */
export type ReconcileResult<O> = { done: true; output: O } | { done: false };

export interface Tool<I = unknown, O = unknown> {
  readonly kind: 'tool';
  readonly name: string;
  readonly description: string;
  readonly class: ToolClass;
  readonly input: z.ZodType<I>;
  readonly output: z.ZodType<O>;
  run(input: I, ctx: ToolContext): Promise<O>;
  reconcile?: (input: I, ctx: ToolContext) => Promise<ReconcileResult<O>>;
  /** The class's policy with the tool's override merged over it. */
  readonly retry: RetryPolicy;
  /** Derives the key from what the operation means, e.g. `invoice:42:create`. */
  readonly idempotencyKey?: (input: I) => string;
  /**
   * Set on a tool made by defineWorkflowTool: calling it starts a child run of this workflow
   * (keyed by the calling stage) and answers with the child's result. Nothing calls run().
   */
  readonly childWorkflow?: ChildWorkflowSpec;
  /**
   * An approval gate (issue 10): the stage of a call waits in `awaiting_approval` for a person's
   * decision before the tool runs. Absent: no approval (and the tool's hash stays what it was).
   */
  readonly approval?: ApprovalSpec;
}

/** A tool's approval gate: always, or when `when(input)` says so; an optional time limit on the decision. */
export interface ApprovalSpec {
  /** true: every call waits for a person; a function: the calls whose input it answers true for. */
  readonly when: true | ((input: unknown) => boolean);
  /** No decision within this long (by the database clock): the call is refused as `approval_timeout`. Null: it waits (for the run's deadline, or a cancel). */
  readonly timeoutMs: number | null;
}

/** A sleep step: its stage waits (no lease, no worker) until a time by the database clock. */
export interface SleepSpec {
  /** A fixed sleep from the moment the step's turn comes; null when `until` decides. */
  readonly ms: number | null;
  /** The time to wake at, from the run's input and earlier results (a past time wakes at once). */
  readonly until?: (args: StepInputArgs) => Date;
}

/** A signal step: its stage waits (no lease, no worker) for `POST /v1/runs/:id/signals/:name`. */
export interface SignalSpec {
  /** The signal's name (in the URL); unique among the workflow's signal steps. */
  readonly name: string;
  /** The payload's schema: a signal whose body it refuses is a 422, nothing kept. The payload is the stage's output. */
  readonly schema: z.ZodType;
  /** No signal within this long from the wait's start: `signal_timeout` (or `onTimeout`). */
  readonly timeoutMs: number;
  /** On timeout, the stage's output instead of failing (from the run's input and earlier results; must be JSON). */
  readonly onTimeout?: (args: StepInputArgs) => unknown;
}

export interface StepInputArgs<I = unknown> {
  /** The run's input. */
  input: I;
  /** Earlier steps' outputs by step name. */
  results: Record<string, unknown>;
}

/** What a step is: one tool call, a map over a list (one stage per item), or a child run of another workflow. */
/** Waits (issue 10): 'sleep' (a timer) and 'signal' (an outside event); neither runs user code in a worker while it waits. */
export type StepKind = 'tool' | 'map' | 'workflow' | 'sleep' | 'signal';

/** A map step: one stage per item of a list computed from earlier results, the outputs gathered in item order. */
export interface MapSpec {
  /** The list (from the run's input and the results of the steps before it); must return an array. */
  readonly items: (args: StepInputArgs) => unknown;
  /** Each item's tool input; without it the item itself is the input. */
  readonly input?: (item: unknown, index: number, args: StepInputArgs) => unknown;
  /** At most this many item stages hold a lease at once for one run, across all workers (null: no bound). */
  readonly maxParallel: number | null;
  /** A list longer than this fails the step with `map_too_large` (default MAP_DEFAULT_MAX_ITEMS). */
  readonly maxItems: number;
}

/** A child-run step: starts a run of another workflow keyed by the parent stage and takes its result or error. */
export interface ChildWorkflowSpec {
  readonly name: string;
  /** The version to start; null: the newest loaded when the child starts. */
  readonly version: number | null;
}

export interface Step {
  /** Defaults to the tool's (or child workflow's) name; unique within the workflow. */
  readonly name: string;
  readonly kind: StepKind;
  /**
   * The tool a stage of this step runs: the step's tool; a map's item tool (the map's own stage
   * runs in its class); for a child-run step the built-in CHILD_RUN_TOOL, which the planner handles.
   */
  readonly tool: Tool;
  /** Computes the tool's (or the child run's) input; without it the run's input is passed on. */
  readonly input?: (args: StepInputArgs) => unknown;
  /**
   * The steps this one waits for, resolved: its `after`, or else the previous step (plus what
   * that step waits for when it has a `when`, so a skipped condition does not skip the rest of
   * a sequence). Empty: it starts with the run.
   */
  readonly after: readonly string[];
  /** A false answer makes the stage `skipped`; a stage whose dependencies were all skipped is skipped too. */
  readonly when?: (args: StepInputArgs) => boolean;
  /** A failure for good becomes the value `{ ok: false, error }` that later steps see, instead of failing the run. */
  readonly continueOnError: boolean;
  readonly map?: MapSpec;
  readonly workflow?: ChildWorkflowSpec;
  readonly sleep?: SleepSpec;
  readonly signal?: SignalSpec;
}

export interface Workflow<I = unknown> {
  readonly kind: 'workflow';
  readonly name: string;
  /**
   * The definition's version (default 1). Several versions of one name may be loaded side by
   * side: submit starts the newest unless told otherwise, and a run finishes on the version it
   * started with (a worker claims only stages of definitions it has loaded).
   */
  readonly version: number;
  readonly input: z.ZodType<I>;
  readonly steps: readonly Step[];
  /** A run deadline relative to submit, if any. */
  readonly deadlineMs: number | null;
  /** The default priority of its runs (README "Priorities"). */
  readonly priority: number;
  /** Hash of the definition's structure (steps, tools, classes, schemas), recorded on each run. */
  readonly hash: string;
  /** Set by the loader: the file the workflow came from (used to load tools in worker threads). */
  sourceFile?: string;
  /**
   * A concurrency key (a user, a tenant, a downstream account) computed from the run's input,
   * and its limit: no more than `limit` stages of runs with one key hold a lease at once,
   * whatever the number of workers.
   */
  readonly concurrencyKey: { key(input: I): string; limit: number } | null;
  /** An agent (made by defineAgent): a model proposes the tool calls; `steps` is empty. */
  readonly agent: AgentSpec | null;
  /**
   * False when the steps are a plain sequence of tool calls (no `after`, `when`, map, child run or
   * continueOnError): such a workflow keeps the hash and the plan it always had.
   */
  readonly graph: boolean;
}

/** The model an agent calls: an OpenAI-compatible chat-completions endpoint. */
export interface ModelSpec {
  /** The model's name at the endpoint, e.g. "gpt-4o-mini". */
  readonly name: string;
  /** The model call's tool class: its lease, heartbeat, timeout and retries (a model call is a stage). */
  readonly class: ToolClass;
  /** Default: OPENAI_BASE_URL at call time. */
  readonly baseURL: string | null;
  /** Default: OPENAI_API_KEY at call time. */
  readonly apiKey: string | null;
  readonly temperature: number | null;
  /** Price per million tokens in and out (any currency, the same for every model you compare); null: no cost is computed. */
  readonly pricing: ModelPricing | null;
  /** Ask the endpoint to stream its answer and pass the tokens to watchers as they arrive (README "Token streaming"). */
  readonly stream: boolean;
}

/** A model's price per million tokens, input (prompt) and output (completion). */
export interface ModelPricing {
  readonly inputPerMillion: number;
  readonly outputPerMillion: number;
}

/** An agent run's limits on model usage: checked before each model call (src/planner/budget.ts). */
export interface AgentBudget {
  /** Input + output tokens over the run's model calls. */
  readonly maxTokens: number | null;
  /** Cost over the run's model calls (needs model.pricing). */
  readonly maxCost: number | null;
}

export interface AgentSpec {
  readonly model: ModelSpec;
  readonly instructions: string;
  /** The allow-list: the only tools the model may call, by exact name. */
  readonly tools: readonly Tool[];
  /** Model calls in one run, at most. */
  readonly maxSteps: number;
  /** Invalid action lists sent back to the model as tool errors, at most; then the run fails with invalid_actions. */
  readonly maxReplans: number;
  /** Tool calls in one model answer, at most. */
  readonly maxActions: number;
  /** The tool calls of one answer run as parallel stages (true), or one after another (false). */
  readonly parallelToolCalls: boolean;
  /**
   * A tool that fails after its retries: 'tell_model' answers the model with the error as the
   * tool's result (at most maxToolErrors per run, then the run fails with too_many_tool_errors);
   * 'fail' fails the run.
   */
  readonly onToolError: 'tell_model' | 'fail';
  readonly maxToolErrors: number;
  /** The built-in `sleep` tool offered to the model, with the longest sleep it may ask for; null: not offered. */
  readonly sleep: { readonly maxMs: number } | null;
  /** Null: no limit. A run that reached it ends `failed` with budget_exceeded before its next model call. */
  readonly budget: AgentBudget | null;
}
