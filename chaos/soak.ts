import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { startScriptedModel } from '../src/agent/scripted-model.js';
import { createClient } from '../src/client/index.js';
import { openStore } from '../src/store/index.js';
import { spawnTs, type Child } from '../test/helpers/child.js';
import { startPrivateRedis } from '../test/helpers/redis-server.js';
import { check, type CheckResult } from './checker.js';
import { agentScript, Driver, FLOOD_TENANT, type PlannedSubmit, planStream } from './driver.js';
import { FaultInjector, LEASE_MS, planFaults, RANDOM_FAULTS } from './faults.js';
import type { CheckConfig, FaultKind, FaultRecord, History, RunFinal, StageFinal } from './history.js';
import { INSTALL_HISTORY_SQL, READ_EVENTS_SQL, READ_RUN_LOG_SQL, READ_STAGE_LOG_SQL, READ_STAGES_SQL } from './history.sql.js';
import { startPrivatePostgres } from './postgres.js';
import { Prng } from './prng.js';
import { startReceiver } from './receiver.js';
import { WorkerPool, withApplicationName } from './workers.js';
import { MAP_MAX_PARALLEL, TENANT_LIMIT } from './workflows/_flows.js';
import { CHAOS_LIMITED_CONCURRENCY, EFFECT_TOOLS } from './workflows/_tools.js';
import { fileURLToPath } from 'node:url';
import { sleep } from './sleep.js';

export interface SoakOptions {
  durationS: number;
  seed: number;
  workers: number;
  /** Submits per second (default 3). */
  rate?: number;
  log?: (line: string) => void;
}

export interface SoakOutcome {
  options: Required<Omit<SoakOptions, 'log'>>;
  history: History;
  result: CheckResult;
  config: CheckConfig;
  /** The tail of every worker's log, for a failing soak. */
  workerLogs: string;
}

/** The API process's application_name (the trigger log's writer of its rows; a worker's is its name). */
export const API_WRITER = 'chaos-api';
/** The workers' poll period (chaos/worker-process.ts): the longest a due stage waits for a free worker to look. */
export const POLL_MS = 200;
/** The workers' sweep period (src/worker/worker.ts default): how often expired leases are re-sent to the transport. */
export const SWEEP_MS = 5000;
/** Longest work of a stage (chaos/driver.ts planSubmit) and longest retry backoff (chaos/workflows/_tools.ts). */
const WORK_MAX_MS = 1500;
const BACKOFF_MAX_MS = 2000;
/** Most stages that work, one after another, in a soak workflow (the agent: model, two tools, model; chaos_parent: p1, c1, c2, p2). */
const MAX_STAGES = 4;
/**
 * Most claims that do no work on one path (chaos_parent: the child step's start and its collect;
 * chaos_map: the expand and the gather), each at most one poll of a worker whose transport is
 * healthy (it polls 5 times slower then: src/worker/worker.ts pollMs) after the wake-up it missed.
 */
const MAX_CONTROL_CLAIMS = 2;
const HEALTHY_POLL_MS = 5 * 200;
/** Reconnects after a fault (pools, Redis) and the scheduling noise of a shared 2-core machine. */
const SLACK_MS = 10_000;

/**
 * The bounds the checker holds the soak to (stated in the report and the README), derived from
 * the soak's configuration rather than picked:
 * - terminal: after the last fault, a run needs at most one lapsed lease and one sweep (a stage
 *   its killed or paused worker held), then each stage's work and one retry backoff, plus slack;
 * - tenant wait: a small tenant's due stage is claimed within a lease and a sweep (a slot of its
 *   key held by a worker a fault stopped; the key's lock held by a partitioned backend is freed
 *   by the partition's reset, LEASE_MS + PAST_LEASE_MAX_MS at most, inside that) plus a poll.
 */
/** The driver's actions the soak must have exercised (as fault kinds of the history). */
const DRIVER_KINDS = ['duplicate_submit', 'cancel', 'retry'] as const satisfies FaultKind[];
/** A failed run is retried by the driver's next round (every 2-4 s): a flaky run submitted this long before the end has failed and been retried. */
/** Every fault kind the driver records (its actions through the API), none of them a fault of the machine. */
const DRIVER_ACTIONS: FaultKind[] = [...DRIVER_KINDS, 'approve', 'reject', 'signal'];
const RETRY_MARGIN_MS = 15_000;

/**
 * The fault kinds a soak must have injected: those its plan holds (a short soak plans fewer
 * than every kind): each planned random fault's kind, the rolling deploy, and of the driver's
 * a duplicate submit, a cancel, and a retry (of a flaky run planned early enough to have failed).
 */
export function plannedKinds(faults: { kind: FaultKind }[], deployAtMs: number, submits: PlannedSubmit[], durationMs: number): FaultKind[] {
  const kinds = new Set<FaultKind>(faults.map((f) => f.kind));
  if (deployAtMs < durationMs) kinds.add('rolling_deploy');
  if (submits.some((p) => p.twiceAtOnce || p.againAfterMs !== null)) kinds.add('duplicate_submit');
  if (submits.some((p) => p.cancelAfterMs !== null)) kinds.add('cancel');
  if (submits.some((p) => p.workflow === 'chaos_flaky' && p.atMs < durationMs - RETRY_MARGIN_MS)) kinds.add('retry');
  return (SOAK_CONFIG.coverage?.faultKinds ?? []).filter((k) => kinds.has(k));
}

export const SOAK_CONFIG: CheckConfig = {
  terminalBoundMs: LEASE_MS + SWEEP_MS + MAX_STAGES * (WORK_MAX_MS + BACKOFF_MAX_MS) + MAX_CONTROL_CLAIMS * HEALTHY_POLL_MS + SLACK_MS,
  tenantWaitBoundMs: LEASE_MS + SWEEP_MS + POLL_MS + 2000,
  floodTenant: FLOOD_TENANT,
  classLimits: { chaos_limited: CHAOS_LIMITED_CONCURRENCY },
  effectTools: EFFECT_TOOLS,
  defaultLeaseMs: LEASE_MS,
  mapLimits: { 'chaos_map:each': MAP_MAX_PARALLEL },
  globalFaultKinds: ['pg_restart', 'redis_restart'],
  globalFaultSlackMs: 10_000,
  // The flaky tool's failure, and a gated call rejected or left undecided (the driver's choice).
  deliberateFailure: ['fails on purpose', 'approval_rejected', 'approval_timeout'],
  gatedTools: ['chaos_gated_effect'],
  coverage: {
    faultKinds: [...RANDOM_FAULTS, 'rolling_deploy', ...DRIVER_KINDS],
    floodKey: FLOOD_TENANT,
    floodKeyLimit: TENANT_LIMIT,
    staleFence: true,
    graph: true,
  },
};

const toMs = (v: string | null) => (v === null ? null : Date.parse(v));

/** Numbers from pg arrive as text for bigint; the log queries cast to float8, so they are numbers. */
function rowsOf<T>(rows: Record<string, unknown>[], map: (r: Record<string, unknown>) => T): T[] {
  return rows.map(map);
}

/**
 * One soak: a private PostgreSQL and Redis, the fenced receiver, the scripted model, the HTTP
 * API and `workers` worker processes; the driver's submits and the injector's faults for
 * `durationS`; then every fault healed, the runs drained (bounded), the history read, every
 * process and directory removed, and the history checked.
 */
export async function runSoak(opts: SoakOptions): Promise<SoakOutcome> {
  const log = opts.log ?? (() => {});
  const options = { durationS: opts.durationS, seed: opts.seed, workers: opts.workers, rate: opts.rate ?? 3 };
  const rng = new Prng(options.seed);
  const cleanups: (() => Promise<unknown>)[] = [];
  const faults: FaultRecord[] = [];
  let pool: WorkerPool | null = null;
  try {
    const cluster = await startPrivatePostgres();
    cleanups.push(() => cluster.close());
    log(`private PostgreSQL on port ${cluster.port}`);
    const admin = new pg.Client({ connectionString: cluster.url() });
    await admin.connect();
    await admin.query('CREATE DATABASE ratchet');
    await admin.query('CREATE DATABASE receiver');
    await admin.end();
    const dbUrl = cluster.url('ratchet');
    const store = await openStore({ databaseUrl: dbUrl, poolSize: 1 }); // migrates
    await store.close();
    const history = new pg.Pool({ connectionString: dbUrl, max: 2 });
    history.on('error', () => {});
    cleanups.push(() => history.end());
    await history.query(INSTALL_HISTORY_SQL);

    const redis = await startPrivateRedis();
    cleanups.push(() => redis.close());
    const receiver = await startReceiver(cluster.url('receiver'));
    cleanups.push(() => receiver.close());
    const model = await startScriptedModel({ script: (req) => agentScript(req) });
    cleanups.push(() => model.close());

    const token = randomBytes(16).toString('hex');
    const api: Child = spawnTs('chaos/api-process.ts', [], {
      DATABASE_URL: withApplicationName(dbUrl, API_WRITER),
      WORKFLOWS_DIR: fileURLToPath(new URL('./workflows/v2', import.meta.url)),
      API_TOKEN: token,
    });
    const killApi = () => api.proc.kill('SIGKILL');
    process.on('exit', killApi); // SIGINT or a crash: not left behind
    cleanups.push(async () => {
      killApi();
      await api.exit;
      process.off('exit', killApi);
    });
    const apiUrl = String((await api.line((o) => typeof o.url === 'string', 90_000)).url);
    const client = createClient({ baseUrl: apiUrl, token, timeoutMs: 5000 });

    pool = new WorkerPool({ pgUrl: dbUrl, redisUrl: redis.url, receiverUrl: receiver.url, modelUrl: model.baseURL }, log);
    const p = pool;
    cleanups.push(() => p.closeAll());
    await Promise.all(Array.from({ length: options.workers }, () => p.spawn(1)));

    const version = { current: 1 as 1 | 2 };
    const driver = new Driver({
      client,
      rng: rng.fork('driver'),
      seed: options.seed,
      rate: options.rate,
      deployVersion: () => version.current,
      faults,
      log,
    });
    const injector = new FaultInjector({ pool, receiver, redis, pg: cluster, driver, faults, log, version });
    const durationMs = options.durationS * 1000;
    const faultPlan = planFaults(rng.fork('faults'), durationMs);
    const submitPlan = planStream(rng.fork('driver').fork('stream'), options.seed, durationMs, options.rate);
    const plan = {
      deployAtMs: faultPlan.deployAtMs,
      faults: faultPlan.faults,
      submits: submitPlan.map((p) => ({
        id: p.id,
        atMs: p.atMs,
        workflow: p.workflow,
        ...(p.twiceAtOnce ? { twiceAtOnce: true } : {}),
        ...(p.againAfterMs !== null ? { againAfterMs: p.againAfterMs } : {}),
        ...(p.cancelAfterMs !== null ? { cancelAfterMs: p.cancelAfterMs } : {}),
      })),
    };
    const startedAt = Date.now();
    const until = startedAt + durationMs;
    log(
      `soak: seed ${options.seed}, ${options.durationS} s, ${options.workers} workers, ${options.rate} submits/s; ` +
        `planned ${faultPlan.faults.length} faults (${faultPlan.faults.map((f) => f.kind).join(' ')}), ${submitPlan.length} submits`,
    );
    await Promise.all([driver.stream(startedAt, until, submitPlan), driver.retries(until), injector.run(startedAt, faultPlan)]);
    await driver.settle(60_000);
    // The terminal bound's clock starts after the injector's last fault; the driver's own actions
    // (a duplicate submit, cancel, retry, approval, signal) are the workload, not faults.
    const lastFaultEndAt = Math.max(until, ...faults.filter((f) => !DRIVER_ACTIONS.includes(f.kind)).map((f) => f.endAt));
    log(`faults over (${faults.length}); draining`);

    // Drain: wait (bounded) until every accepted run is terminal, read from the database.
    const ids = [...driver.accepted.keys()];
    // Keyed backlogs (a flood) drain at their key's limit after the last fault: the checker judges
    // each run against its own clock; the drain only caps the wait.
    const drainUntil = lastFaultEndAt + 3 * SOAK_CONFIG.terminalBoundMs;
    for (;;) {
      const { rows } = await history
        .query<{ n: number }>(`SELECT count(*)::int AS n FROM ratchet.runs WHERE id = ANY($1::uuid[]) AND state IN ('queued', 'running')`, [
          ids,
        ])
        .catch(() => ({ rows: [{ n: -1 }] }));
      if (rows[0]!.n === 0 || Date.now() > drainUntil) break;
      await sleep(500);
    }
    // Stages an ended run left behind (a map's items inserted by a finish that raced the run's end) are
    // cancelled by a sweep (CANCEL_LEFTOVERS_SQL): wait for that too, two sweep periods at most.
    for (const leftUntil = Date.now() + 2 * SWEEP_MS; Date.now() < leftUntil; ) {
      const { rows } = await history
        .query<{ n: number }>(
          `SELECT count(*)::int AS n FROM ratchet.stages s JOIN ratchet.runs r ON r.id = s.run_id
           WHERE r.state IN ('succeeded', 'failed', 'cancelled', 'expired') AND s.state NOT IN ('succeeded', 'failed', 'cancelled', 'skipped')`,
        )
        .catch(() => ({ rows: [{ n: -1 }] }));
      if (rows[0]!.n === 0) break;
      await sleep(500);
    }
    const endedAt = Date.now();
    log(`drained in ${endedAt - lastFaultEndAt} ms`);

    // The API's answers: every run's final state (paged), and the result of versioned runs.
    const runs: RunFinal[] = [];
    let cursor: string | undefined;
    for (let page = 0; page < 10_000; page++) {
      const list = await client.list({ limit: 500, ...(cursor ? { cursor } : {}) });
      for (const r of list.runs) {
        runs.push({
          id: r.id,
          workflow: r.workflow,
          state: r.state,
          createdAt: Date.parse(r.createdAt),
          finishedAt: toMs(r.finishedAt),
          ...(r.state === 'failed' ? { error: r.error } : {}),
        });
      }
      if (!list.nextCursor) break;
      cursor = list.nextCursor;
    }
    for (const r of runs) {
      if (driver.versions[r.id] === undefined || r.state !== 'succeeded') continue;
      const view = await client.get(r.id);
      r.resultVersion = (view.result as { version?: number } | null)?.version ?? null;
    }
    const stageLog = rowsOf((await history.query(READ_STAGE_LOG_SQL)).rows, (r) => ({
      id: r.id as number,
      at: r.at as number,
      txAt: r.tx_at as number,
      txid: r.txid as string,
      op: r.op as 'insert' | 'update',
      stageId: r.stage_id as string,
      runId: r.run_id as string,
      tool: r.tool as string,
      toolClass: r.tool_class as string,
      concurrencyKey: r.concurrency_key as string | null,
      concurrencyLimit: r.concurrency_limit as number | null,
      oldState: r.old_state as string | null,
      newState: r.new_state as string,
      oldFence: r.old_fence as string | null,
      newFence: r.new_fence as string | null,
      oldOwner: r.old_owner as string | null,
      newOwner: r.new_owner as string | null,
      oldLeaseUntil: r.old_lease_until as number | null,
      newLeaseUntil: r.new_lease_until as number | null,
      availableAt: r.available_at as number | null,
      attempt: r.attempt as number,
      errorCode: r.error_code as string | null,
      seq: r.seq as number | null,
      step: r.step as string | null,
      deps: r.deps as number[] | null,
      itemIndex: r.item_index as number | null,
      groupSeq: r.group_seq as number | null,
      leaseMs: r.lease_ms as number | null,
      writer: r.writer as string | null,
    }));
    const runLog = rowsOf((await history.query(READ_RUN_LOG_SQL)).rows, (r) => ({
      id: r.id as number,
      at: r.at as number,
      txAt: r.tx_at as number,
      txid: r.txid as string,
      op: r.op as 'insert' | 'update',
      runId: r.run_id as string,
      workflow: r.workflow as string,
      oldState: r.old_state as string | null,
      newState: r.new_state as string,
      parentRunId: r.parent_run_id as string | null,
    }));
    const stages: StageFinal[] = rowsOf((await history.query(READ_STAGES_SQL)).rows, (r) => ({
      id: r.id as string,
      runId: r.run_id as string,
      tool: r.tool as string,
      state: r.state as string,
      effectKey: r.effect_key as string | null,
    }));
    const h: History = {
      seed: options.seed,
      startedAt,
      lastFaultEndAt,
      endedAt,
      stageLog,
      runLog,
      ledger: receiver.ledger,
      effects: await receiver.effects(),
      submits: driver.submits,
      runs,
      stages,
      faults,
      versions: driver.versions,
      events: rowsOf((await history.query(READ_EVENTS_SQL)).rows, (r) => ({
        id: r.id as number,
        runId: r.run_id as string,
        stageId: r.stage_id as string | null,
        type: r.type as string,
        fence: r.fence as string | null,
        at: r.at as number,
      })),
      deployStartedAt: injector.deployStartedAt,
      plan,
    };
    const workerLogs = pool.logs();
    // The class limit is required to be reached only in soaks of 120 s and more (see coverage.classLimits).
    // Fault kinds: those the seed planned for this duration (all of them from about a minute on).
    const faultKinds = plannedKinds(faultPlan.faults, faultPlan.deployAtMs, submitPlan, durationMs);
    const config: CheckConfig = {
      ...SOAK_CONFIG,
      coverage: { ...SOAK_CONFIG.coverage!, faultKinds, ...(options.durationS >= 120 ? {} : { classLimits: false }) },
    };
    const result = check(h, config);
    return { options, history: h, result, config, workerLogs };
  } finally {
    for (const c of cleanups.reverse()) await c().catch((err: unknown) => log(`cleanup: ${String(err)}`));
  }
}

export { LEASE_MS };
