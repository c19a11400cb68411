import { z } from 'zod';
import { RUN_STATES, STAGE_STATES, type RunState, type StageState } from '../planner/states.js';

/**
 * What `explain(run)` answers: one verdict about a run that looks slow or hung, and the
 * evidence it rests on, each fact named. JSON-ready (timestamps are ISO strings, durations
 * milliseconds by the database clock), so the engine, the HTTP API and the CLI show the same.
 */
const ts = z.iso.datetime({ offset: true });
const ms = z.number().int();

/** How recently a worker must have been seen serving a class for it to count as served. */
export const WORKER_SEEN_WITHIN_MS = 30_000;

export const VERDICTS = [
  'running_healthy',
  'stuck',
  'queued_retry_delayed',
  'queued_concurrency_limit',
  'queued_key_limit',
  'queued_rate_limited',
  'queued_no_worker',
  'queued_no_worker_for_version',
  'queued_backlog',
  'queued_ready',
  'waiting_for_child',
  'waiting_for_items',
  'waiting_for_signal',
  'awaiting_approval',
  'sleeping_until',
  'terminal',
  'no_active_stage',
  'unknown_run',
] as const;
export type Verdict = (typeof VERDICTS)[number];

export const explainedStageSchema = z
  .object({
    id: z.string(),
    seq: z.number().int(),
    name: z.string(),
    tool: z.string(),
    toolClass: z.string(),
    state: z.enum(STAGE_STATES as [StageState, ...StageState[]]),
    attempt: z.number().int(),
    maxAttempts: z.number().int(),
  })
  .strict()
  .meta({ id: 'ExplainedStage' });

/** Who serves the stage's class: worker rows seen lately, and the latest heartbeat of any lease of the class. */
const served = {
  workersServingClass: z.number().int().describe(`workers that reported serving the class within ${WORKER_SEEN_WITHIN_MS} ms`),
  lastWorkerSeenAt: ts.nullable(),
  lastClassHeartbeatAt: ts.nullable().describe('the latest heartbeat of any running stage of the class'),
};

const evidence = {
  running_healthy: z
    .object({
      owner: z.string().nullable(),
      fence: z.string().nullable(),
      leaseUntil: ts,
      leaseRemainingMs: ms,
      heartbeatAt: ts.nullable(),
      heartbeatAgeMs: ms.nullable(),
      heartbeatIntervalMs: ms.nullable().describe("the class's heartbeat, when this process knows the class"),
      claimedAt: ts.nullable(),
      runningForMs: ms.nullable(),
    })
    .strict(),
  stuck: z
    .object({
      owner: z.string().nullable(),
      fence: z.string().nullable(),
      leaseUntil: ts,
      expiredForMs: ms,
      heartbeatAt: ts.nullable(),
      heartbeatAgeMs: ms.nullable(),
      ...served,
    })
    .strict(),
  queued_retry_delayed: z.object({ availableAt: ts, dueInMs: ms, attemptsUsed: z.number().int(), lastError: z.unknown() }).strict(),
  queued_concurrency_limit: z.object({ toolClass: z.string(), liveLeases: z.number().int(), limit: z.number().int() }).strict(),
  queued_key_limit: z.object({ concurrencyKey: z.string(), liveLeases: z.number().int(), limit: z.number().int() }).strict(),
  queued_rate_limited: z
    .object({ toolClass: z.string(), claimsInWindow: z.number().int(), max: z.number().int(), windowMs: ms, nextSlotAt: ts.nullable() })
    .strict(),
  queued_no_worker: z.object({ toolClass: z.string(), seenWithinMs: ms, queuedForMs: ms, ...served }).strict(),
  queued_no_worker_for_version: z
    .object({
      toolClass: z.string(),
      workflow: z.string(),
      definitionHash: z
        .string()
        .describe("the hash of the definition the run started with: only a worker that loaded it claims the run's stages"),
      version: z.number().int().nullable().describe('its declared version, when this process has loaded that definition'),
      workersWithDefinition: z
        .number()
        .int()
        .describe(`workers of the class that reported having loaded the definition within ${WORKER_SEEN_WITHIN_MS} ms`),
      seenWithinMs: ms,
      queuedForMs: ms,
      ...served,
    })
    .strict(),
  queued_backlog: z
    .object({ toolClass: z.string(), ahead: z.number().int(), liveLeases: z.number().int(), queuedForMs: ms, ...served })
    .strict(),
  queued_ready: z.object({ toolClass: z.string(), liveLeases: z.number().int(), queuedForMs: ms, ...served }).strict(),
  waiting_for_child: z
    .object({
      childRunId: z.string(),
      workflow: z.string(),
      childState: z.enum(RUN_STATES as [RunState, ...RunState[]]),
      childVerdict: z.string().describe("the child run's own verdict (explain it by its id for the evidence)"),
      childSummary: z.string(),
    })
    .strict(),
  waiting_for_items: z
    .object({
      items: z.number().int(),
      open: z.number().int().describe('items not yet ended (pending, queued or running)'),
      running: z.number().int(),
      succeeded: z.number().int(),
      failed: z.number().int(),
      maxParallel: z.number().int().nullable(),
    })
    .strict(),
  waiting_for_signal: z
    .object({
      signal: z.string(),
      since: ts.describe('when the wait started'),
      timeoutAt: ts.nullable().describe('when it times out (signal_timeout, or its onTimeout), by the database clock'),
      timeoutMs: ms.nullable(),
      waitingForMs: ms,
      overdueMs: ms.nullable().describe('how long past its timeout it is (a sweeper ends it); null when not past'),
      onTimeout: z.enum(['fail', 'on_timeout']),
    })
    .strict(),
  awaiting_approval: z
    .object({
      tool: z.string(),
      since: ts,
      timeoutAt: ts.nullable().describe('when the call is refused as approval_timeout; null: it waits for a person'),
      waitingForMs: ms,
      overdueMs: ms.nullable(),
      approveWith: z.string().describe('the CLI command a person uses'),
    })
    .strict(),
  sleeping_until: z
    .object({
      until: ts,
      since: ts,
      remainingMs: ms.describe('0 when due (a sweeper queues it)'),
      overdueMs: ms.nullable(),
    })
    .strict(),
  terminal: z
    .object({
      state: z.enum(RUN_STATES as [RunState, ...RunState[]]),
      finishedAt: ts.nullable(),
      error: z.unknown(),
      result: z.boolean().describe('the run has a result'),
    })
    .strict(),
  no_active_stage: z.object({ stageStates: z.array(z.string()) }).strict(),
  unknown_run: z.object({}).strict(),
} as const satisfies Record<Verdict, z.ZodType>;

const common = {
  runId: z.string(),
  runState: z.enum(RUN_STATES as [RunState, ...RunState[]]).nullable(),
  /** One sentence for people, naming the evidence. */
  summary: z.string(),
  stage: explainedStageSchema.nullable(),
  deadline: ts.nullable(),
  deadlinePassed: z.boolean(),
  /** The database's time when the evidence was read. */
  checkedAt: ts,
};

function variant<V extends Verdict>(v: V) {
  return z.object({ verdict: z.literal(v), ...common, evidence: evidence[v] }).strict();
}

export const explanationSchema = z
  .discriminatedUnion('verdict', [
    variant('running_healthy'),
    variant('stuck'),
    variant('queued_retry_delayed'),
    variant('queued_concurrency_limit'),
    variant('queued_key_limit'),
    variant('queued_rate_limited'),
    variant('queued_no_worker'),
    variant('queued_no_worker_for_version'),
    variant('queued_backlog'),
    variant('queued_ready'),
    variant('waiting_for_child'),
    variant('waiting_for_items'),
    variant('waiting_for_signal'),
    variant('awaiting_approval'),
    variant('sleeping_until'),
    variant('terminal'),
    variant('no_active_stage'),
    variant('unknown_run'),
  ])
  .meta({ id: 'Explanation', description: 'why a run is where it is: one verdict and the evidence it rests on' });

export type Explanation = z.infer<typeof explanationSchema>;
export type ExplanationOf<V extends Verdict> = Extract<Explanation, { verdict: V }>;
export type EvidenceOf<V extends Verdict> = ExplanationOf<V>['evidence'];
