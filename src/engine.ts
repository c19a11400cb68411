import { processMetrics } from './observability/metrics.js';
import { recordWaitEnded } from './observability/wait-metrics.js';
import { v7 as uuidv7 } from 'uuid';
import { startRunSpan } from './observability/tracing.js';
import type { Logger } from 'pino';
import { z } from 'zod';
import { resolveDuration } from './definitions/duration.js';
import { prioritySchema } from './definitions/priority.js';
import { loadDefinitions } from './definitions/loader.js';
import { createRegistry, type Registry } from './definitions/registry.js';
import type { Workflow } from './definitions/types.js';
import { workflowVersionSchema } from './definitions/workflow.js';
import { InvalidInputError } from './errors.js';
import { defaultLogger } from './logger.js';
import { planStaticRun } from './planner/plan.js';
import { planAgentRun } from './planner/agent-run.js';
import type { RunState, StageState } from './planner/states.js';
import { openStore, retentionPolicySchema, type CancelResult, type EventRow, type Store } from './store/index.js';
import type { ListRunsFilter, RetryResult, RunPage } from './store/index.js';
import { explainRun } from './observability/explain.js';
import type { Explanation } from './observability/explanation.js';
import { isStorableText, toJsonText } from './store/json.js';
import { isStorableTime, STORABLE_TIME_RANGE } from './store/limits.js';
import { parseInput } from './store/validate.js';
import { createInProcessTransport } from './transport/in-process.js';
import { createBullmqTransport } from './transport/bullmq.js';
import type { Transport } from './transport/transport.js';
import { laneOf } from './transport/lane.js';
import { Worker, type WorkerOptions } from './worker/worker.js';
import type { ToolRunner } from './worker/executor.js';
import { assertThreadSources, createThreadRunner } from './worker/thread-runner.js';
import type { Schedule } from './schedules/define.js';
import { fireDueSchedules } from './schedules/fire.js';
import { checkCodeSchedules, createScheduleService, syncCodeSchedules, type ScheduleService } from './schedules/service.js';
import { retryWhileUnavailable } from './store/startup-wait.js';

const ratchetOptions = z
  .object({
    /** PostgreSQL URL; default DATABASE_URL; unset = embedded PGlite. */
    databaseUrl: z.string().min(1).optional(),
    /** Embedded data directory (default RATCHET_DATA_DIR or .ratchet/). */
    dataDir: z.string().min(1).optional(),
    /** Redis for BullMQ wake-ups; default REDIS_URL. */
    redisUrl: z.string().min(1).optional(),
    workflows: z.array(z.custom<Workflow>()).optional(),
    workflowsDir: z.string().min(1).optional(),
    /** Schedules made by defineSchedule (those exported from files under workflowsDir are added). */
    schedules: z.array(z.custom<Schedule>()).optional(),
    logger: z.custom<Logger>().optional(),
    poolSize: z.number().int().min(1).max(1000).optional(),
    /** Client-side limit on one statement's answer (default 10 s). */
    queryTimeoutMs: z.number().int().positive().optional(),
    /** Give up on a new PostgreSQL connection after this long (default 10 s). */
    connectionTimeoutMs: z.number().int().positive().optional(),
    /** How long start-up (migrations, the schedules' sync) waits for a database that does not answer, trying again (default 30 s; 0 tries once). */
    startupWaitMs: z.number().int().min(0).optional(),
    transport: z.custom<Transport>().optional(),
    threadRunner: z.custom<ToolRunner>().optional(),
    /** How long finished runs are kept, per state (`{ succeeded: '7d', failed: '30d' }`); workers' sweepers prune the rest. Default: kept. */
    retention: retentionPolicySchema.optional(),
  })
  .strict();
export type RatchetOptions = z.input<typeof ratchetOptions>;

const submitOptions = z
  .object({
    idempotencyKey: z.string().min(1).max(500).refine(isStorableText, 'must be Unicode text without \\u0000').optional(),
    /** Start this loaded version of the workflow (default: the newest loaded). */
    version: workflowVersionSchema.optional(),
    /** An absolute Date, or a duration from now ("10m", ms). Overrides the workflow's. */
    deadline: z.union([z.date().refine(isStorableTime, STORABLE_TIME_RANGE), z.string(), z.number()]).optional(),
    /** Higher is claimed first within a tool class (README "Priorities"). Overrides the workflow's. */
    priority: prioritySchema.optional(),
  })
  .strict();
export type SubmitOptions = z.input<typeof submitOptions>;

export interface RunView {
  id: string;
  workflow: string;
  state: RunState;
  stages: {
    seq: number;
    name: string;
    tool: string;
    state: StageState;
    attempt: number;
    fence: string | null;
    leaseUntil: Date | null;
    heartbeatAt: Date | null;
    lastError: unknown;
    /** The stage's own idempotency key, and the key its tool derived for its effect (null: it sent the stage's own). */
    idempotencyKey: string;
    effectKey: string | null;
    /** The seqs of the stages it waits for (the run graph; [] for the first stages, a map's items, an agent's first call). */
    deps: number[];
  }[];
  result: unknown;
  error: unknown;
  deadline: Date | null;
  createdAt: Date;
  finishedAt: Date | null;
}

export interface Ratchet {
  readonly store: Store;
  readonly registry: Registry;
  readonly transport: Transport;
  readonly logger: Logger;
  submit(workflow: string, input: unknown, opts?: SubmitOptions): Promise<{ id: string; state: RunState; created: boolean }>;
  getRun(id: string): Promise<RunView | null>;
  events(id: string): Promise<EventRow[]>;
  worker(opts?: WorkerOptions): Worker;
  cancel(id: string): Promise<CancelResult | null>;
  close(): Promise<void>;
  /** Retries a failed run from its failed stages (fresh attempt budget, history kept); null for an unknown id. */
  retry(id: string): Promise<RetryResult | null>;
  /** Why a run is where it is: one verdict and its evidence (src/observability/explain.ts). */
  explain(id: string): Promise<Explanation>;
  /** Runs, newest first, filtered, one page at a time. */
  listRuns(filter?: ListRunsFilter): Promise<RunPage>;
  /** Cron schedules: create / replace, list, delete (src/schedules/); workers fire them. */
  readonly schedules: ScheduleService;
}

/** A duration given to submit: bad input (InvalidInputError naming its path), not a bad definition. */
function submitDuration(value: string | number, path: string): number {
  const d = resolveDuration(value);
  if ('problem' in d) throw new InvalidInputError(d.problem, path);
  return d.ms;
}

/**
 * The engine: a store (PostgreSQL or embedded PGlite), the registry of workflows, a transport
 * for wake-ups, and workers. `submit` validates the input with the workflow's schema and
 * persists the run with its whole plan in one transaction.
 */
export async function createRatchet(options: RatchetOptions = {}): Promise<Ratchet> {
  const opts = parseInput(ratchetOptions, options, 'createRatchet');
  if (!opts.workflows && !opts.workflowsDir) throw new InvalidInputError('give `workflows` or `workflowsDir`', 'createRatchet.workflows');
  const logger = opts.logger ?? defaultLogger();
  const loaded = opts.workflowsDir ? await loadDefinitions(opts.workflowsDir) : { workflows: [], schedules: [] };
  const workflows = [...(opts.workflows ?? []), ...loaded.workflows];
  const registry = createRegistry(workflows);
  const codeSchedules = [...(opts.schedules ?? []), ...loaded.schedules];
  checkCodeSchedules(codeSchedules, registry);
  // Tools of isolation: 'thread' classes need a thread runner (without one they would run inline): make one unless given; close() closes it.
  const ownThreadRunner =
    !opts.threadRunner && registry.toolClasses().some((c) => c.isolation === 'thread') ? createThreadRunner({ logger }) : null;
  const threadRunner = opts.threadRunner ?? ownThreadRunner ?? undefined;
  const store = await openStore({
    databaseUrl: opts.databaseUrl ?? (process.env.DATABASE_URL || undefined), // an empty variable counts as unset
    dataDir: opts.dataDir ?? (process.env.RATCHET_DATA_DIR || undefined),
    poolSize: opts.poolSize,
    queryTimeoutMs: opts.queryTimeoutMs,
    connectionTimeoutMs: opts.connectionTimeoutMs,
    startupWaitMs: opts.startupWaitMs,
    logger,
  });
  // PostgreSQL + Redis: BullMQ carries wake-ups between processes. Embedded: in-process.
  const redisUrl = opts.redisUrl ?? (process.env.REDIS_URL || undefined);
  const transport =
    opts.transport ??
    (redisUrl && store.kind === 'postgres'
      ? createBullmqTransport({ redisUrl, logger, dueIn: (stageId) => store.dueIn(stageId) })
      : createInProcessTransport());
  const workers = new Set<Worker>();
  // Schedules from code are synced by a process that says which it defines: it loads workflow files (workflowsDir) or passes
  // `schedules` (even []). That is what lets a schedule removed from the files be retired; a process given only `workflows` syncs nothing.
  if (codeSchedules.length > 0 || opts.workflowsDir || opts.schedules) {
    try {
      await retryWhileUnavailable(
        'schedules sync',
        () => syncCodeSchedules(store.db, codeSchedules, [...new Set(workflows.map((w) => w.name))], logger),
        { waitMs: opts.startupWaitMs, logger },
      );
    } catch (err) {
      await transport.close().catch(() => {});
      await store.close().catch(() => {});
      throw err;
    }
  }

  const ratchet: Ratchet = {
    store,
    registry,
    transport,
    logger,
    async submit(name, input, submitOpts = {}) {
      const so = parseInput(submitOptions, submitOpts, 'submit.options');
      const workflow = registry.require(name, so.version);
      toJsonText(input, 'input'); // before the workflow's schema walks it: \u0000, lone surrogates, absurd depth or size
      const parsed = workflow.input.safeParse(input);
      if (!parsed.success) {
        const issue = parsed.error.issues[0]!;
        throw new InvalidInputError(issue.message, ['input', ...issue.path.map(String)].join('.'), {
          issues: parsed.error.issues.map((i) => ({ path: i.path.map(String), message: i.message })),
        });
      }
      // A duration counts from the database's now (the store adds it there), never this process's clock.
      const deadline =
        so.deadline instanceof Date
          ? { deadline: so.deadline }
          : so.deadline !== undefined
            ? { deadlineInMs: submitDuration(so.deadline, 'submit.options.deadline') }
            : workflow.deadlineMs !== null
              ? { deadlineInMs: workflow.deadlineMs }
              : {};
      const runId = uuidv7();
      const span = startRunSpan(runId, workflow.name); // issue 12: the run's span, its traceparent stored on the run
      const created = await store
        .createRun({
          id: runId,
          ...(span.traceparent ? { traceparent: span.traceparent } : {}),
          workflow: workflow.name,
          definitionHash: workflow.hash,
          input: parsed.data,
          idempotencyKey: so.idempotencyKey,
          ...deadline,
          requestedDeadline: so.deadline instanceof Date ? so.deadline.toISOString() : so.deadline,
          requestedVersion: so.version,
          priority: so.priority ?? workflow.priority,
          ...(workflow.agent ? { stages: planAgentRun(workflow) } : planStaticRun(workflow, parsed.data)),
        })
        .then(
          (c) => {
            span.end(c.created);
            return c;
          },
          (err: unknown) => {
            span.end(false);
            throw err;
          },
        );
      // Every stage that waits for nothing is queued now (a graph may start with several): wake a worker of each class.
      if (created.created)
        for (const q of created.queued) transport.notify(laneOf(q.toolClass, workflow.hash), { stageId: q.stageId, attempt: 1 });
      logger.info(
        { event: 'run_submitted', runId: created.id, workflow: workflow.name, version: workflow.version, created: created.created },
        'run submitted',
      );
      return { id: created.id, state: created.state, created: created.created };
    },
    async getRun(id) {
      const r = await store.getRun(id);
      if (!r) return null;
      return {
        id: r.id,
        workflow: r.workflow,
        state: r.state,
        result: r.result,
        error: r.error,
        deadline: r.deadline,
        createdAt: r.createdAt,
        finishedAt: r.finishedAt,
        stages: r.stages.map((s) => ({
          seq: s.seq,
          name: s.name,
          tool: s.tool,
          state: s.state,
          attempt: s.attempt,
          fence: s.fence,
          leaseUntil: s.leaseUntil,
          heartbeatAt: s.heartbeatAt,
          lastError: s.error,
          idempotencyKey: s.idempotencyKey,
          effectKey: s.effectKey,
          deps: s.deps ?? [],
        })),
      };
    },
    events: (id) => store.listEvents(id),
    worker(workerOpts) {
      const workflowNames = [...new Set(registry.list().map((wf) => wf.name))];
      const fireSchedules = (owner: string) =>
        fireDueSchedules({
          db: store.db,
          owner,
          workflows: () => workflowNames,
          submit: (name, input, o) => ratchet.submit(name, input, o),
          logger,
        }).then(() => undefined);
      const w = new Worker({ store, registry, transport, logger, threadRunner, retention: opts.retention, fireSchedules }, workerOpts);
      if (ownThreadRunner) assertThreadSources(registry.list(), w.classes);
      workers.add(w);
      return w;
    },
    cancel: async (id) => {
      const r = await store.cancelRun(id);
      // The waits the cancel closed (issue 10), counted where they ended.
      for (const kind of r?.waitsClosed ?? []) recordWaitEnded(processMetrics().registry, kind, 'cancelled');
      return r;
    },
    async close() {
      for (const w of workers) await w.stop({ graceMs: 0 });
      await ownThreadRunner?.close();
      await transport.close();
      await store.close();
    },
    async retry(id) {
      const res = await store.retryRun(id);
      const hash = res?.retried && res.queued.length > 0 ? (await store.getRun(id))?.definitionHash : undefined;
      if (hash) for (const q of res!.queued) transport.notify(laneOf(q.toolClass, hash), { stageId: q.stageId, attempt: 1 });
      for (const q of res?.childQueued ?? []) transport.notify(laneOf(q.toolClass, q.definitionHash), { stageId: q.stageId, attempt: 1 });
      if (res?.retried) logger.info({ event: 'run_retried', runId: id, stageId: res.stage?.id }, 'run retried');
      return res;
    },
    explain: (id) => explainRun({ store, registry }, id),
    listRuns: (filter) => store.listRuns(filter),
    schedules: createScheduleService(store.db, registry),
  };
  return ratchet;
}
