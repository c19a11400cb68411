/**
 * Engine benchmark (not a test): `npm run bench -- [--quick] [--skip-peers] [--skip-peer-procs] [--peer-procs-rounds N] [--runs N] [--peer-runs N] [--cap S]
 *   [--concurrency C] [--variants queue:1,queue:4,fast:1,fast:4] [--timeout-s S] [--pg-url URL] [--redis-url URL]
 *   [--scale | --scale-only] [--stream | --stream-only] [--stream-watchers N] [--stream-runs R]
 *   [--stream-topology split|one-process]`.
 * --stream adds the live-stream section: one run's stages/s with 0 vs N (50) watchers of its stream (see streamSection).
 * stdout: one JSON line per figure, {"bench":"engine","metric","variant","value","unit","info"}; stderr: progress.
 *
 * No-op runs of 10 stages (bench/workflows/noop.ts) through real worker processes
 * (bench/worker-process.ts, `node --import tsx`, compiled once into tsx's cache) with BullMQ
 * wake-ups on Redis, in four variants: the fast path off (every stage is queued, woken and
 * claimed) and on (the finish of stage n claims stage n+1 in the same statement), with 1 and
 * with 4 worker processes. Per variant: a fresh database and a fresh BullMQ prefix; the
 * workers connect and wait; N runs are submitted through `ratchet.submit` (parallel); then all
 * workers are told to go at once. Figures come from the database:
 *   - stages/s and runs/s over min(first_claimed_at) .. max(finished_at) of the stages;
 *   - stage pick-up latency p50/p99: first_claimed_at of stage n+1 - finished_at of stage n;
 *     stage 1: first_claimed_at - greatest(run created_at, the moment the workers were told to go)
 *     (every run is waiting at go, so under this burst both are mostly the wait behind the backlog);
 *   - the same latencies under light load (`light_*`): fresh workers of the variant, runs submitted
 *     one by one 100 ms apart, stage 1 measured from the run's created_at (submit -> BullMQ -> claim);
 *   - every run succeeded (verified, in info), commits and WAL flushes per stage (pg_stat_database,
 *     pg_stat_wal), machine CPU busy and CPU by process kind (/proc), and the workers' own
 *     statement profile (count, rows, ms per prepared statement).
 * Then, in the same invocation, ../shared/peers/run.sh (DBOS, pg-boss, graphile-worker, BullMQ,
 * pgbench; --peer-runs N repetitions, --cap S passed through) and the ratios of the fast path's
 * stages/s to each; then graphile-worker and BullMQ at 1 and 4 worker processes in alternating rounds
 * (bench/peers-more-procs.ts; --skip-peer-procs, --peer-procs-rounds N), printed beside the check "more processes
 * never slower". --runs N is the number of workflow runs per variant (default 2000, 20,000 stages like the peers' 20,000 jobs; --quick 200).
 */
import { execFileSync, spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Queue } from 'bullmq';
import pg from 'pg';
import { createRatchet, type Ratchet } from '../src/engine.js';
import { silentLogger } from '../src/logger.js';
import { createBullmqTransport } from '../src/transport/bullmq.js';
import { laneOf } from '../src/transport/lane.js';
import { cpuBusyPct, cpuSnap, createDb, dropDb, emit, log, percentile, round, type Line } from './lib.js';
import { bestByVariant, cpuPerStage, moreProcsChecks, parseConcurrencies } from './matrix.js';
import { runPeersMoreProcs, type PeerProcsResult } from './peers-more-procs.js';
import { NOOP_CLASS, NOOP_STEPS, noop10 } from './workflows/noop.js';

const { values: argv } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    'skip-peers': { type: 'boolean', default: false },
    /** Skip the peers at 1 and 4 worker processes (bench/peers-more-procs.ts; after run.sh, ~2 min). */
    'skip-peer-procs': { type: 'boolean', default: false },
    /** Rounds (each a pair: 1 process and 4, the order alternating) of each peer at 1 and 4 worker processes. */
    'peer-procs-rounds': { type: 'string', default: '3' },
    /** Skip each variant's light-load phase (pick-up latency without a backlog). */
    'skip-light': { type: 'boolean', default: false },
    /** Workflow runs per variant (each of 10 stages). */
    runs: { type: 'string' },
    /** Repetitions of each peer measurement (run.sh --runs). */
    'peer-runs': { type: 'string', default: '1' },
    /** Passed to run.sh --cap (seconds of processing per peer trial). */
    cap: { type: 'string' },
    /**
     * Stages at once per worker process (the worker's claim and finish batch size), a list: every variant runs at
     * each (fresh database each). The ratios to the peers come at 10 (the history's keys) and at each variant's best.
     */
    concurrency: { type: 'string', default: '10,50' },
    /**
     * Warm-up runs per worker process, before the measured window (0: none): the same processes first run these
     * (not measured, not counted), then stop that worker, keep their pool's connections and make a fresh worker that
     * the measured runs' "go" starts, so the figures leave out each process's fixed start cost (V8 compiling the
     * hot paths, each PostgreSQL backend planning each statement its first times), as in a long-running service.
     * Default 0: the peers of ../shared/peers/run.sh are timed from their start over 20,000 jobs, so by default
     * Ratchet's window is cold too (2,000 runs of 10 stages; its worker processes are spawned and ready before "go",
     * their first plans and V8's compiling fall inside the window): ratios like for like. 200 gives the steady state.
     */
    'warmup-runs': { type: 'string', default: '0' },
    /** Concurrencies of the scale sweep: numbers and/or "best" (fast:4's best of the variants above, when run). */
    'scale-concurrency': { type: 'string', default: '10' },
    /** Warm-up runs per worker process at each point of the scale sweep (fewer than the variants': 8 processes x 200 is minutes). */
    'scale-warmup-runs': { type: 'string', default: '50' },
    variants: { type: 'string', default: 'queue:1,queue:4,fast:1,fast:4' },
    'timeout-s': { type: 'string' },
    /** The "how it scales" section (after the variants; --scale-only: without them and the peers). */
    scale: { type: 'boolean', default: false },
    'scale-only': { type: 'boolean', default: false },
    /**
     * The live-stream section (after the variants; --stream-only: without them and the peers): one run's
     * stages/s watched by 0 and by --stream-watchers server-sent event streams (bench/stream.ts part 1).
     */
    stream: { type: 'boolean', default: false },
    'stream-only': { type: 'boolean', default: false },
    'stream-watchers': { type: 'string', default: '50' },
    /** Measured rounds (after one warm-up round): one run per variant each. */
    'stream-runs': { type: 'string', default: '5' },
    /** Nice values of the watchers' process, one variant each, the first the headline (bench/stream.ts --watcher-priorities). */
    'stream-watcher-priorities': { type: 'string', default: '19,0' },
    /**
     * split (default): the task API the watchers connect to in a process of its own, the engine and its worker in
     * another, as `ratchet serve` and `ratchet worker`; one-process: all three in one (bench/stream.ts --topology).
     */
    'stream-topology': { type: 'string', default: 'split' },
    /** Worker-process counts of the scale sweep (fast path). */
    'scale-procs': { type: 'string', default: '1,2,4,8' },
    /** Runs per point of the sweep (default 500). */
    'scale-runs': { type: 'string', default: '500' },
    /** Add the 1,000,000-waiting claim point (the bulk insert takes minutes on a busy 2-core machine). */
    'claim-1m': { type: 'boolean', default: false },
    /** Parts of the scale section after the sweep (default all): claim, reclaim, pglite. */
    'scale-parts': { type: 'string', default: 'claim,reclaim,pglite' },
    'pg-url': { type: 'string', default: process.env.RATCHET_BENCH_PG_URL ?? 'postgres://root@127.0.0.1:5432/test' },
    'redis-url': { type: 'string', default: process.env.RATCHET_BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379' },
  },
});

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const cfg = {
  adminUrl: argv['pg-url'],
  redisUrl: argv['redis-url'],
  // 2,000 runs = 20,000 stages, the peers' job count (run.sh), timed the same way (from start): ratios like for like.
  runs: argv.runs ? Number(argv.runs) : argv.quick ? 200 : 2000,
  concurrencies: parseConcurrencies(argv.concurrency),
  warmupRuns: Number(argv['warmup-runs']),
  timeoutS: argv['timeout-s'] ? Number(argv['timeout-s']) : argv.quick ? 180 : 600,
  submitters: 16,
  /** Light-load phase: runs submitted one by one, this far apart, to fresh workers (pick-up without a backlog). */
  lightRuns: argv.quick ? 20 : 50,
  lightGapMs: 100,
  peerRuns: Number(argv['peer-runs']),
  peerProcsRounds: Number(argv['peer-procs-rounds']),
  cap: argv.cap,
  variants: argv.variants.split(',').map((v) => {
    const [mode, procs, flag] = v.trim().split(':');
    if ((mode !== 'queue' && mode !== 'fast') || !/^\d+$/.test(procs ?? '') || (flag !== undefined && flag !== 'nograce'))
      throw new Error(`bad variant ${v}: use queue:N or fast:N (optionally :nograce, the sweeper without its grace)`);
    return { mode: mode as 'queue' | 'fast', procs: Number(procs), noGrace: flag === 'nograce' };
  }),
  // ../shared/peers from the main checkout (/work/main); ../../shared/peers from a worktree (/work/wt/<name>).
  peersScript:
    process.env.RATCHET_PEERS_SCRIPT ??
    [join(ROOT, '..', 'shared', 'peers', 'run.sh'), join(ROOT, '..', '..', 'shared', 'peers', 'run.sh')].find((f) => existsSync(f)) ??
    join(ROOT, '..', 'shared', 'peers', 'run.sh'),
  workerScript: join(ROOT, 'bench', 'worker-process.ts'),
};
for (const [k, v] of Object.entries({
  runs: cfg.runs,
  timeoutS: cfg.timeoutS,
  peerRuns: cfg.peerRuns,
  peerProcsRounds: cfg.peerProcsRounds,
})) {
  if (!Number.isInteger(v) || v < 1) throw new Error(`--${k} must be a positive whole number`);
}
if (!Number.isInteger(cfg.warmupRuns) || cfg.warmupRuns < 0) throw new Error('--warmup-runs must be a whole number (0: no warm-up)');

const out = (line: Line) => emit('engine', line);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const label = (mode: 'queue' | 'fast', procs: number) => `${mode === 'fast' ? 'fast_path' : 'bullmq'},procs=${procs}`;

// ---- CPU by process kind, from /proc ------------------------------------------------------
const CLK_TCK = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();
type ProcSnap = Map<number, { comm: string; ticks: number }>;
function procSnap(): ProcSnap {
  const snap: ProcSnap = new Map();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const close = stat.lastIndexOf(')');
      const comm = stat.slice(stat.indexOf('(') + 1, close);
      const f = stat.slice(close + 2).split(' '); // f[0] = field 3 (state); utime = field 14, stime = 15
      snap.set(Number(name), { comm, ticks: Number(f[11]) + Number(f[12]) });
    } catch {
      /* gone */
    }
  }
  return snap;
}
/** CPU ms spent between two snapshots, by kind: the bench's workers, this process, postgres, redis, anything else. */
function cpuByKind(
  before: ProcSnap,
  after: ProcSnap,
  workerPids: Set<number>,
  pgPids?: { thisDb: Set<number>; background: Set<number> },
): Record<string, unknown> {
  const by: Record<string, number> = { ratchet_workers: 0, bench_main: 0, postgres: 0, redis: 0, other: 0 };
  // The machine's PostgreSQL is shared (other databases, other users' tests): split its CPU into
  // the backends of this database, the cluster's background processes, and the rest.
  const pgSplit = { postgres_this_db: 0, postgres_background: 0, postgres_other: 0 };
  const others: Record<string, number> = {};
  for (const [pid, a] of after) {
    const b = before.get(pid);
    const ms = ((a.ticks - (b && b.comm === a.comm ? b.ticks : 0)) * 1000) / CLK_TCK;
    if (ms <= 0) continue;
    const kind = workerPids.has(pid)
      ? 'ratchet_workers'
      : pid === process.pid
        ? 'bench_main'
        : a.comm === 'postgres'
          ? 'postgres'
          : a.comm.startsWith('redis-server')
            ? 'redis'
            : 'other';
    by[kind]! += ms;
    if (kind === 'other') others[a.comm] = (others[a.comm] ?? 0) + ms;
    if (kind === 'postgres' && pgPids) {
      if (pgPids.thisDb.has(pid)) pgSplit.postgres_this_db += ms;
      else if (pgPids.background.has(pid)) pgSplit.postgres_background += ms;
      else pgSplit.postgres_other += ms;
    }
  }
  const top = Object.entries(others)
    .sort((x, y) => y[1] - x[1])
    .slice(0, 4)
    .map(([c, ms]) => `${c}:${Math.round(ms)}`);
  return {
    ...Object.fromEntries(Object.entries(by).map(([k, v]) => [k, Math.round(v)])),
    ...(pgPids ? Object.fromEntries(Object.entries(pgSplit).map(([k, v]) => [k, Math.round(v)])) : {}),
    other_top: top,
  };
}

/** PostgreSQL processes serving database `url` (backends, autovacuum) and the cluster's background processes. */
async function pgPidsOf(client: pg.Client): Promise<{ thisDb: Set<number>; background: Set<number> }> {
  const r = await client.query(
    `SELECT pid, (datname = current_database()) AS ours, datname IS NULL AND backend_type <> 'client backend' AS bg FROM pg_stat_activity`,
  );
  return {
    thisDb: new Set(r.rows.filter((x) => x.ours).map((x) => Number(x.pid))),
    background: new Set(r.rows.filter((x) => x.bg).map((x) => Number(x.pid))),
  };
}

// ---- PostgreSQL counters (like shared/peers: commits in the scratch db, cluster-wide WAL flushes) --
async function pgCounters(url: string): Promise<{ xacts: number; fsyncs: number }> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    const r = await c.query(
      `SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS xacts, wal_sync AS fsyncs FROM pg_stat_wal`,
    );
    return { xacts: Number(r.rows[0].xacts), fsyncs: Number(r.rows[0].fsyncs) };
  } finally {
    await c.end();
  }
}

// ---- worker processes -----------------------------------------------------------------------
interface WorkerProc {
  child: ChildProcessWithoutNullStreams;
  pid: number;
  messages: Record<string, unknown>[];
  waiters: (() => void)[];
  exited: boolean;
}

function spawnWorker(i: number, env: Record<string, string>): WorkerProc {
  // BENCH_WORKER_NODE_ARGS: extra node flags for the workers, e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof".
  const extra = (process.env.BENCH_WORKER_NODE_ARGS ?? '').split(' ').filter(Boolean);
  const child = spawn(process.execPath, [...extra, '--import', 'tsx', cfg.workerScript], {
    cwd: ROOT,
    env: { ...process.env, ...env, WORKER_NAME: `bench-w${i}` },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  const w: WorkerProc = { child, pid: child.pid!, messages: [], waiters: [], exited: false };
  createInterface({ input: child.stdout }).on('line', (line) => {
    try {
      w.messages.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      process.stderr.write(`[w${i} stdout] ${line}\n`);
    }
    for (const f of w.waiters.splice(0)) f();
  });
  createInterface({ input: child.stderr }).on('line', (line) => process.stderr.write(`[w${i}] ${line.slice(0, 400)}\n`));
  child.on('exit', (code, signal) => {
    w.exited = true;
    if (code !== 0) log(`worker w${i} (pid ${w.pid}) exited with ${code ?? signal}`);
    for (const f of w.waiters.splice(0)) f();
  });
  return w;
}

async function waitFor(w: WorkerProc, key: string, timeoutMs: number): Promise<Record<string, unknown>> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const m = w.messages.find((x) => x[key] === true);
    if (m) return m;
    if (w.exited) throw new Error(`worker pid ${w.pid} exited before "${key}"`);
    if (Date.now() > until) throw new Error(`worker pid ${w.pid}: no "${key}" within ${timeoutMs} ms`);
    await new Promise<void>((r) => {
      const t = setTimeout(r, Math.max(1, until - Date.now()));
      w.waiters.push(() => {
        clearTimeout(t);
        r();
      });
    });
  }
}

/** Waits up to `ms` for the process to exit on its own (after "stopped" it exits at once). */
async function waitExit(w: WorkerProc, ms: number): Promise<void> {
  const until = Date.now() + ms;
  while (!w.exited && Date.now() < until) {
    await new Promise<void>((r) => {
      const t = setTimeout(r, Math.max(1, until - Date.now()));
      w.waiters.push(() => {
        clearTimeout(t);
        r();
      });
    });
  }
}

function redisConnection(url: string) {
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port || 6379), ...(u.password ? { password: decodeURIComponent(u.password) } : {}) };
}

// ---- one variant ------------------------------------------------------------------------------
interface VariantResult {
  /** The variant with its concurrency, e.g. fast_path,procs=4,concurrency=10. */
  label: string;
  /** Without the concurrency, e.g. fast_path,procs=4 (the ratio lines' keys). */
  base: string;
  mode: 'queue' | 'fast';
  procs: number;
  concurrency: number;
  cpu: { workers: number; postgres: number; total: number };
  stagesPerS: number;
  runsPerS: number;
  /** Every run succeeded, the light-load phase's included. */
  allOk: boolean;
  /** Every run of the measured window succeeded (what picks the best concurrency). */
  measuredOk: boolean;
  info: Record<string, unknown>;
}

async function runVariant(
  mode: 'queue' | 'fast',
  procs: number,
  o: { concurrency: number; runs?: number; light?: boolean; noGrace?: boolean; warmupRuns?: number },
): Promise<VariantResult> {
  const runsN = o.runs ?? cfg.runs;
  const conc = o.concurrency;
  const warmN = (o.warmupRuns ?? cfg.warmupRuns) * procs;
  const base = `${label(mode, procs)}${o.noGrace ? ',nograce' : ''}`;
  const variant = `${label(mode, procs)},concurrency=${conc}${o.noGrace ? ',nograce' : ''}`;
  const dbName = `bench_engine_${mode}_p${procs}_c${conc}${o.noGrace ? '_ng' : ''}`;
  const url = await createDb(cfg.adminUrl, dbName);
  const prefix = `ratchet-bench-${randomBytes(4).toString('hex')}`;
  const workers: WorkerProc[] = [];
  // The lane's queue (src/transport/lane.ts): class-<class>.<definition hash>, not class-<class> (that one stays empty).
  const bullQueue = new Queue(`class-${laneOf(NOOP_CLASS, noop10.hash)}`, { prefix, connection: redisConnection(cfg.redisUrl) });
  let main: Ratchet | undefined;
  try {
    // Migrate once here; then the workers connect and wait for "go".
    let store: Ratchet['store'] | undefined;
    main = await createRatchet({
      databaseUrl: url,
      workflows: [noop10],
      logger: silentLogger(),
      poolSize: cfg.submitters,
      transport: createBullmqTransport({ redisUrl: cfg.redisUrl, prefix, logger: silentLogger(), dueIn: (id) => store!.dueIn(id) }),
    });
    store = main.store;
    const tSpawn = performance.now();
    for (let i = 0; i < procs; i++) {
      workers.push(
        spawnWorker(i, {
          DATABASE_URL: url,
          REDIS_URL: cfg.redisUrl,
          BULL_PREFIX: prefix,
          FAST_PATH: mode === 'fast' ? '1' : '0',
          CONCURRENCY: String(conc),
          ...(o.noGrace ? { SWEEP_GRACE: '0' } : {}),
        }),
      );
    }
    await Promise.all(workers.map((w) => waitFor(w, 'ready', 60_000)));
    const spawnS = (performance.now() - tSpawn) / 1000;

    // Submit runs through the public API (validate, plan, one transaction, BullMQ wake-up for stage 1).
    const submitN = async (n: number) => {
      let next = 0;
      await Promise.all(
        Array.from({ length: cfg.submitters }, async () => {
          while (next < n) {
            next++;
            await main!.submit('noop10', {});
          }
        }),
      );
    };
    // Warm-up: the same processes run warmN runs (not measured), then rest with a fresh worker each (bench/worker-process.ts).
    let warmup: Record<string, unknown> = { runs: 0 };
    let since = new Date(0); // the measured runs are those created from here on
    if (warmN > 0) {
      const tw = performance.now();
      await submitN(warmN);
      const warmSnap = procSnap();
      for (const w of workers) w.child.stdin.write('warm\n');
      const wAdmin = new pg.Client({ connectionString: url });
      await wAdmin.connect();
      try {
        const until = Date.now() + cfg.timeoutS * 1000;
        let n = 0;
        while (Date.now() < until) {
          n = (
            await wAdmin.query(`SELECT count(*)::int AS n FROM ratchet.runs WHERE state IN ('succeeded','failed','cancelled','expired')`)
          ).rows[0].n as number;
          if (n >= warmN || workers.some((w) => w.exited)) break;
          await sleep(100);
        }
        const warmS = (performance.now() - tw) / 1000;
        // What the warm-up cost, per stage: against the measured window's, the per-process fixed cost (V8, plans).
        const warmCpu = cpuPerStage(
          cpuByKind(warmSnap, procSnap(), new Set(workers.map((w) => w.pid)), await pgPidsOf(wAdmin)),
          warmN * NOOP_STEPS,
        );
        for (const w of workers) w.child.stdin.write('rest\n');
        await Promise.all(workers.map((w) => waitFor(w, 'rested', 30_000)));
        since = (await wAdmin.query('SELECT ratchet.db_now() AS t')).rows[0].t as Date;
        warmup = {
          runs: warmN,
          runs_per_process: warmN / procs,
          terminal: n,
          s: round(warmS, 2),
          stages_per_s: round((warmN * NOOP_STEPS) / warmS, 0),
          cpu_ms_per_stage: warmCpu,
        };
        if (n < warmN) throw new Error(`${variant}: warm-up: ${n}/${warmN} runs terminal`);
      } finally {
        await wAdmin.end();
      }
      log(
        `${variant}: warm-up of ${warmN} runs (${warmN / procs} per process) in ${warmup.s} s; cpu/stage ${JSON.stringify(warmup.cpu_ms_per_stage)} ms`,
      );
    }
    const jobs0 = await bullQueue.count();
    const tSubmit = performance.now();
    await submitN(runsN);
    const submitS = (performance.now() - tSubmit) / 1000;
    // The wake-ups are sent fire-and-forget: wait until BullMQ holds all of them before closing.
    const untilJobs = Date.now() + 30_000;
    let jobs = 0;
    while (Date.now() < untilJobs) {
      jobs = (await bullQueue.count()) - jobs0;
      if (jobs >= runsN) break;
      await sleep(50);
    }
    await main.close();
    main = undefined;
    log(
      `${variant}: ${procs} worker(s) ready in ${round(spawnS, 1)} s; ${runsN} runs submitted in ${round(submitS, 2)} s (${Math.round(runsN / submitSafe(submitS))} runs/s); ${jobs} wake-ups waiting in BullMQ`,
    );

    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    try {
      await sleep(1000); // backends flush their statistics at most once a second
      const before = await pgCounters(url);
      const goAt = (await admin.query('SELECT ratchet.db_now() AS t')).rows[0].t as Date;
      const cpu = cpuSnap();
      const procBefore = procSnap();
      const t0 = performance.now();
      for (const w of workers) w.child.stdin.write('go\n');

      // Wait until every run is terminal (or the timeout).
      const deadline = t0 + cfg.timeoutS * 1000;
      let terminal = 0;
      let lastLog = t0;
      while (performance.now() < deadline) {
        terminal = Number(
          (
            await admin.query(
              `SELECT count(*) AS n FROM ratchet.runs WHERE state IN ('succeeded','failed','cancelled','expired') AND created_at >= $1`,
              [since],
            )
          ).rows[0].n,
        );
        if (terminal >= runsN) break;
        if (workers.every((w) => w.exited)) break;
        if (performance.now() - lastLog > 10_000) {
          lastLog = performance.now();
          log(`${variant}: ${terminal}/${runsN} runs done after ${round((lastLog - t0) / 1000, 1)} s`);
        }
        await sleep(100);
      }
      const wallS = (performance.now() - t0) / 1000;
      const cpuBusy = cpuBusyPct(cpu);
      const procAfter = procSnap();
      const pgPids = await pgPidsOf(admin);
      const timedOut = terminal < runsN;

      for (const w of workers) if (!w.exited) w.child.stdin.write('stop\n');
      const stopped = await Promise.all(workers.map((w) => waitFor(w, 'stopped', 15_000).catch((err: Error) => ({ error: err.message }))));
      await Promise.all(workers.map((w) => waitExit(w, 5000)));
      await sleep(600);
      const after = await pgCounters(url);

      const q = async (text: string, params: unknown[] = []) => (await admin.query(text, params)).rows;
      // Only the measured runs (created since the warm-up ended; all of them without one).
      const measured = `run_id IN (SELECT id FROM ratchet.runs WHERE created_at >= $1)`;
      const [runs] = await q(
        `SELECT count(*)::int AS total, count(*) FILTER (WHERE state = 'succeeded')::int AS succeeded,
        count(*) FILTER (WHERE state = 'failed')::int AS failed FROM ratchet.runs WHERE created_at >= $1`,
        [since],
      );
      const [st] = await q(
        `SELECT count(*)::int AS total, count(*) FILTER (WHERE state = 'succeeded')::int AS succeeded,
        coalesce(sum(attempt), 0)::int AS attempts, count(DISTINCT owner_id)::int AS owners,
        extract(epoch FROM max(finished_at) - min(first_claimed_at))::float8 AS window_s
        FROM ratchet.stages WHERE ${measured}`,
        [since],
      );
      const [ev] = await q(
        `SELECT count(*)::int AS events,
        count(*) FILTER (WHERE type = 'job_claimed' AND (data ->> 'fastPath') = 'true')::int AS fast_claims,
        count(*) FILTER (WHERE type = 'job_claimed')::int AS claims,
        count(*) FILTER (WHERE type = 'result_rejected')::int AS rejected,
        count(*) FILTER (WHERE type = 'lease_reclaimed')::int AS reclaimed,
        count(*) FILTER (WHERE type = 'heartbeat_lost')::int AS heartbeat_lost
        FROM ratchet.events WHERE ${measured}`,
        [since],
      );
      const nextMs = await q(
        `SELECT extract(epoch FROM s.first_claimed_at - p.finished_at)::float8 * 1000 AS ms,
          (s.owner_id = p.owner_id) AS same_owner
        FROM ratchet.stages s JOIN ratchet.stages p ON p.run_id = s.run_id AND p.seq = s.seq - 1
        WHERE s.seq > 1 AND s.first_claimed_at IS NOT NULL AND p.finished_at IS NOT NULL AND s.${measured}`,
        [since],
      );
      const firstMs = await q(
        `SELECT extract(epoch FROM s.first_claimed_at - greatest(r.created_at, $1::timestamptz))::float8 * 1000 AS ms
        FROM ratchet.stages s JOIN ratchet.runs r ON r.id = s.run_id WHERE s.seq = 1 AND s.first_claimed_at IS NOT NULL AND r.created_at >= $2`,
        [goAt, since],
      );
      const next = nextMs.map((r) => r.ms as number);
      const first = firstMs.map((r) => r.ms as number);

      const done = st.succeeded as number;
      const windowS = (st.window_s as number | null) ?? wallS;
      const stagesPerS = done / windowS;
      const runsPerS = (runs.succeeded as number) / windowS;
      const allOk = !timedOut && runs.succeeded === runsN && st.succeeded === runsN * NOOP_STEPS && st.attempts === runsN * NOOP_STEPS;
      const pct = (xs: number[], p: number) => (xs.length ? round(percentile(xs, p)!, 2) : null);

      // The workers' statement profile, summed, per stage.
      type Stmt = { n: number; rows: number; ms: number; max_ms: number; next_claimed?: number };
      const statements: Record<string, Stmt> = {};
      const ended: Record<string, number> = {};
      const wakes = { notified: 0, received: 0 };
      const workerCpu: number[] = [];
      const threadCpu: Record<string, number> = {}; // summed over the processes: main thread, other threads
      const dbLanes = (stopped as Record<string, any>[]).map((s) => s.db_lanes ?? null); // each process's share at its end
      for (const s of stopped as Record<string, any>[]) {
        for (const [k, v] of Object.entries((s.thread_cpu_ms ?? {}) as Record<string, number>)) threadCpu[k] = (threadCpu[k] ?? 0) + v;
        for (const [k, v] of Object.entries((s.statements ?? {}) as Record<string, Stmt>)) {
          const t = (statements[k] ??= { n: 0, rows: 0, ms: 0, max_ms: 0 });
          t.n += v.n;
          t.rows += v.rows;
          t.ms += v.ms;
          t.max_ms = Math.max(t.max_ms, v.max_ms);
          if (v.next_claimed !== undefined) t.next_claimed = (t.next_claimed ?? 0) + v.next_claimed;
        }
        for (const [k, v] of Object.entries((s.ended ?? {}) as Record<string, number>)) ended[k] = (ended[k] ?? 0) + v;
        wakes.notified += s.wakes?.notified ?? 0;
        wakes.received += s.wakes?.received ?? 0;
        if (s.cpu_ms) workerCpu.push(round(s.cpu_ms.user + s.cpu_ms.system, 0));
      }
      const perStage = Object.fromEntries(
        Object.entries(statements).map(([k, v]) => [
          k,
          {
            per_stage: round(v.n / Math.max(done, 1), 3),
            rows_per_call: v.n ? round(v.rows / v.n, 2) : null,
            mean_ms: v.n ? round(v.ms / v.n, 2) : null,
            max_ms: round(v.max_ms, 1),
            calls: v.n,
            ...(v.next_claimed !== undefined ? { next_claimed_in_finish: v.next_claimed } : {}),
          },
        ]),
      );

      const cpuKinds = cpuByKind(procBefore, procAfter, new Set(workers.map((w) => w.pid)), pgPids);
      const info = {
        runs: runsN,
        stages: runsN * NOOP_STEPS,
        runs_succeeded: runs.succeeded,
        runs_failed: runs.failed,
        stages_succeeded: st.succeeded,
        attempts: st.attempts,
        all_succeeded: allOk,
        timed_out: timedOut,
        window_s: round(windowS, 3),
        wall_s: round(wallS, 2),
        processes: procs,
        concurrency_per_process: conc,
        concurrency: conc,
        warmup,
        fast_path: mode === 'fast',
        pickup_p50_ms: pct(next, 50),
        pickup_p99_ms: pct(next, 99),
        cpu_busy_pct: cpuBusy,
        xacts_per_stage: round((after.xacts - before.xacts) / Math.max(done, 1), 3),
        wal_fsyncs_per_stage: round((after.fsyncs - before.fsyncs) / Math.max(done, 1), 3),
        cpu_ms_by_kind: cpuKinds,
        worker_cpu_ms: workerCpu,
        worker_thread_cpu_ms: threadCpu,
        db_lanes: dbLanes,
        events_per_stage: round((ev.events as number) / Math.max(done, 1), 2),
        fast_path_claims: ev.fast_claims,
        claims: ev.claims,
        rejected: ev.rejected,
        reclaimed: ev.reclaimed,
        heartbeat_lost_events: ev.heartbeat_lost,
        owners: st.owners,
        next_stage_same_process_pct: nextMs.length ? round((100 * nextMs.filter((r) => r.same_owner).length) / nextMs.length, 1) : null,
        spawn_to_ready_s: round(spawnS, 2),
        submit_runs_per_s: round(runsN / submitSafe(submitS), 0),
        wakeups_notified: wakes.notified,
        wakeups_received: wakes.received,
        attempt_ends: ended,
        bullmq_prefix: prefix,
      };
      const cpuSt = cpuPerStage(cpuKinds, done);
      const lineInfo = {
        concurrency: conc,
        warmup_runs: warmN,
        all_succeeded: allOk,
        runs_succeeded: runs.succeeded,
        window_s: info.window_s,
        cpu_busy_pct: cpuBusy,
        xacts_per_stage: info.xacts_per_stage,
        wal_fsyncs_per_stage: info.wal_fsyncs_per_stage,
      };
      out({ metric: 'stages_per_s', variant, value: round(stagesPerS, 1), unit: 'stages/s', info });
      out({
        metric: 'cpu_ms_per_stage',
        variant,
        value: cpuSt.total,
        unit: 'ms',
        info: {
          workers: cpuSt.workers,
          postgres_this_db: cpuSt.postgres,
          warmup_cpu_ms_per_stage: warmup.cpu_ms_per_stage ?? null,
          of: 'CPU ms over the measured window by the worker processes + the PostgreSQL backends of the bench database, per succeeded stage (/proc)',
          ...lineInfo,
        },
      });
      out({ metric: 'runs_per_s', variant, value: round(runsPerS, 1), unit: 'runs/s', info: lineInfo });
      out({
        metric: 'pickup_p50',
        variant,
        value: pct(next, 50),
        unit: 'ms',
        info: {
          of: 'first_claimed_at(stage n+1) - finished_at(stage n)',
          concurrency: conc,
          samples: next.length,
          max_ms: next.length ? round(Math.max(...next), 1) : null,
          zero_pct: next.length ? round((100 * next.filter((x) => x === 0).length) / next.length, 1) : null,
        },
      });
      out({ metric: 'pickup_p99', variant, value: pct(next, 99), unit: 'ms', info: { concurrency: conc, samples: next.length } });
      out({
        metric: 'first_pickup_p50',
        variant,
        value: pct(first, 50),
        unit: 'ms',
        info: {
          of: 'first_claimed_at(stage 1) - greatest(run created_at, go); all runs wait at go: backlog wait',
          concurrency: conc,
          samples: first.length,
        },
      });
      out({ metric: 'first_pickup_p99', variant, value: pct(first, 99), unit: 'ms', info: { concurrency: conc, samples: first.length } });
      out({
        metric: 'all_runs_succeeded',
        variant,
        value: allOk,
        unit: 'bool',
        info: {
          concurrency: conc,
          warmup_runs: warmN,
          runs: runsN,
          runs_succeeded: runs.succeeded,
          runs_failed: runs.failed,
          stages_succeeded: st.succeeded,
          attempts: st.attempts,
          rejected: ev.rejected,
          reclaimed: ev.reclaimed,
          timed_out: timedOut,
        },
      });
      out({
        metric: 'profile',
        variant,
        value: null,
        unit: 'statements',
        info: {
          concurrency: conc,
          statements_per_stage: perStage,
          cpu_ms_by_kind: cpuKinds,
          worker_cpu_ms: workerCpu,
          window_s: info.window_s,
          cpu_busy_pct: cpuBusy,
        },
      });
      log(
        `${variant}: ${round(stagesPerS, 1)} stages/s, ${round(runsPerS, 1)} runs/s over ${round(windowS, 2)} s; pick-up p50 ${pct(next, 50)} ms p99 ${pct(next, 99)} ms; ` +
          `${runs.succeeded}/${runsN} runs succeeded${allOk ? '' : ' — NOT ALL'}; cpu ${cpuBusy}%; ${info.xacts_per_stage} xacts/stage; cpu/stage ${cpuSt.workers} + ${cpuSt.postgres} ms; cpu ms ${JSON.stringify(cpuKinds)}`,
      );
      const light = o.light === false ? { allOk: true, skipped: true } : await lightPhase(variant, url, prefix, mode, procs, conc, admin);
      return {
        label: variant,
        base,
        mode,
        procs,
        concurrency: conc,
        cpu: cpuSt,
        stagesPerS,
        runsPerS,
        allOk: allOk && light.allOk === true,
        measuredOk: allOk,
        info: { ...info, light },
      };
    } finally {
      await admin.end();
    }
  } finally {
    for (const w of workers) if (!w.exited) w.child.kill('SIGKILL');
    await main?.close().catch(() => {});
    await bullQueue.obliterate({ force: true }).catch((err: Error) => log(`obliterate ${prefix}: ${err.message}`));
    await bullQueue.close().catch(() => {});
    await dropDb(cfg.adminUrl, dbName);
  }
}

/**
 * Pick-up latency without a backlog: fresh worker processes (same variant), runs submitted one
 * at a time `lightGapMs` apart through ratchet.submit (stage 1 woken through BullMQ), so each
 * stage's pick-up is the engine's own delay, not its wait behind 10,000 others.
 */
async function lightPhase(
  variant: string,
  url: string,
  prefix: string,
  mode: 'queue' | 'fast',
  procs: number,
  conc: number,
  admin: pg.Client,
): Promise<Record<string, unknown>> {
  const workers: WorkerProc[] = [];
  let main: Ratchet | undefined;
  try {
    let store: Ratchet['store'] | undefined;
    main = await createRatchet({
      databaseUrl: url,
      workflows: [noop10],
      logger: silentLogger(),
      poolSize: 2,
      transport: createBullmqTransport({ redisUrl: cfg.redisUrl, prefix, logger: silentLogger(), dueIn: (id) => store!.dueIn(id) }),
    });
    store = main.store;
    for (let i = 0; i < procs; i++) {
      workers.push(
        spawnWorker(i, {
          DATABASE_URL: url,
          REDIS_URL: cfg.redisUrl,
          BULL_PREFIX: prefix,
          FAST_PATH: mode === 'fast' ? '1' : '0',
          CONCURRENCY: String(conc),
        }),
      );
    }
    await Promise.all(workers.map((w) => waitFor(w, 'ready', 60_000)));
    for (const w of workers) w.child.stdin.write('go\n');
    await Promise.all(workers.map((w) => waitFor(w, 'started', 30_000)));
    await sleep(500);
    const ids: string[] = [];
    for (let i = 0; i < cfg.lightRuns; i++) {
      ids.push((await main.submit('noop10', {})).id);
      await sleep(cfg.lightGapMs);
    }
    const until = Date.now() + 60_000;
    let done = 0;
    while (Date.now() < until) {
      done = Number(
        (
          await admin.query(
            `SELECT count(*) AS n FROM ratchet.runs WHERE id = ANY($1::uuid[]) AND state IN ('succeeded','failed','cancelled','expired')`,
            [ids],
          )
        ).rows[0].n,
      );
      if (done >= ids.length) break;
      await sleep(100);
    }
    const [r] = (
      await admin.query(`SELECT count(*) FILTER (WHERE state = 'succeeded')::int AS ok FROM ratchet.runs WHERE id = ANY($1::uuid[])`, [ids])
    ).rows;
    const next = (
      await admin.query(
        `SELECT extract(epoch FROM s.first_claimed_at - p.finished_at)::float8 * 1000 AS ms
      FROM ratchet.stages s JOIN ratchet.stages p ON p.run_id = s.run_id AND p.seq = s.seq - 1
      WHERE s.run_id = ANY($1::uuid[]) AND s.seq > 1 AND s.first_claimed_at IS NOT NULL AND p.finished_at IS NOT NULL`,
        [ids],
      )
    ).rows.map((x) => x.ms as number);
    const first = (
      await admin.query(
        `SELECT extract(epoch FROM s.first_claimed_at - r.created_at)::float8 * 1000 AS ms
      FROM ratchet.stages s JOIN ratchet.runs r ON r.id = s.run_id WHERE s.run_id = ANY($1::uuid[]) AND s.seq = 1 AND s.first_claimed_at IS NOT NULL`,
        [ids],
      )
    ).rows.map((x) => x.ms as number);
    const runMs = (
      await admin.query(
        `SELECT extract(epoch FROM finished_at - created_at)::float8 * 1000 AS ms FROM ratchet.runs WHERE id = ANY($1::uuid[]) AND finished_at IS NOT NULL`,
        [ids],
      )
    ).rows.map((x) => x.ms as number);
    const pct = (xs: number[], p: number) => (xs.length ? round(percentile(xs, p)!, 2) : null);
    const light = {
      runs: ids.length,
      runs_succeeded: r.ok,
      allOk: r.ok === ids.length,
      gap_ms: cfg.lightGapMs,
      pickup_p50_ms: pct(next, 50),
      pickup_p99_ms: pct(next, 99),
      first_pickup_p50_ms: pct(first, 50),
      first_pickup_p99_ms: pct(first, 99),
      run_p50_ms: pct(runMs, 50),
      run_p99_ms: pct(runMs, 99),
    };
    const info = {
      of: 'light load: runs submitted one by one 100 ms apart to idle workers',
      concurrency: conc,
      runs: ids.length,
      runs_succeeded: r.ok,
      samples: next.length,
    };
    out({
      metric: 'light_pickup_p50',
      variant,
      value: light.pickup_p50_ms,
      unit: 'ms',
      info: { ...info, of: `${info.of}; first_claimed_at(stage n+1) - finished_at(stage n)` },
    });
    out({ metric: 'light_pickup_p99', variant, value: light.pickup_p99_ms, unit: 'ms', info });
    out({
      metric: 'light_first_pickup_p50',
      variant,
      value: light.first_pickup_p50_ms,
      unit: 'ms',
      info: { ...info, of: `${info.of}; first_claimed_at(stage 1) - run created_at (submit -> BullMQ -> claim)`, samples: first.length },
    });
    out({
      metric: 'light_first_pickup_p99',
      variant,
      value: light.first_pickup_p99_ms,
      unit: 'ms',
      info: { ...info, samples: first.length },
    });
    out({
      metric: 'light_run_latency_p50',
      variant,
      value: light.run_p50_ms,
      unit: 'ms',
      info: { ...info, of: `${info.of}; run finished_at - created_at (10 stages)`, samples: runMs.length },
    });
    log(
      `${variant} light load: pick-up p50 ${light.pickup_p50_ms} ms p99 ${light.pickup_p99_ms} ms; stage 1 p50 ${light.first_pickup_p50_ms} ms p99 ${light.first_pickup_p99_ms} ms; run p50 ${light.run_p50_ms} ms; ${r.ok}/${ids.length} succeeded`,
    );
    for (const w of workers) if (!w.exited) w.child.stdin.write('stop\n');
    await Promise.all(workers.map((w) => waitFor(w, 'stopped', 15_000).catch(() => null)));
    await Promise.all(workers.map((w) => waitExit(w, 5000)));
    return light;
  } finally {
    for (const w of workers) if (!w.exited) w.child.kill('SIGKILL');
    await main?.close().catch(() => {});
  }
}

function submitSafe(s: number): number {
  return s > 0 ? s : 1e-9;
}

// ---- peers ------------------------------------------------------------------------------------
interface PeerLine {
  measure: string;
  variant: string;
  metric: string;
  unit: string;
  median: number | null;
  cpu_busy_pct: number | null;
  xacts_per_item: number | null;
  wal_fsyncs_per_item: number | null;
  runs: number[];
  failed_runs: number;
  errors: string[];
  info: unknown[];
}

async function runPeers(): Promise<PeerLine[]> {
  const args = [
    cfg.peersScript,
    'dbos',
    'pgboss',
    'graphile',
    'bullmq',
    'pgbench',
    '--runs',
    String(cfg.peerRuns),
    ...(cfg.cap ? ['--cap', cfg.cap] : []),
  ];
  log(`peers: bash ${args.join(' ')}`);
  const child = spawn('bash', args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  const lines: PeerLine[] = [];
  const raw: string[] = [];
  createInterface({ input: child.stdout }).on('line', (line) => {
    if (!line.trim()) return;
    raw.push(line);
    try {
      lines.push(JSON.parse(line) as PeerLine);
    } catch {
      process.stderr.write(`[peers stdout] ${line}\n`);
    }
  });
  createInterface({ input: child.stderr }).on('line', (line) => process.stderr.write(`[peers] ${line}\n`));
  const killer = setTimeout(() => {
    log('peers: 45 min passed, stopping them');
    child.kill('SIGTERM');
  }, 45 * 60_000);
  const code = await new Promise<number | null>((r) => child.on('close', (c) => r(c)));
  clearTimeout(killer);
  const file = join(tmpdir(), `ratchet-bench-peers-${new Date().toISOString().replace(/[:.]/g, '-')}.jsonl`);
  writeFileSync(file, raw.map((l) => `${l}\n`).join(''));
  log(`peers: exit ${code}, ${lines.length} lines (raw in ${file})`);
  return lines;
}

// ---- how it scales ------------------------------------------------------------------------------
/**
 * `--scale`: (1) the fast path's stages/s and CPU per stage (worker processes + the PostgreSQL
 * backends of the bench's database, from /proc) against 1, 2, 4, 8 worker processes; (2) claim
 * latency (one claimer, limit 1, sequential) with 10,000 (and with --claim-1m 1,000,000) stages
 * waiting, bulk-inserted with generate_series; (3) reclaim latency after SIGKILL: a worker holding
 * stages of a 3 s lease is killed, another worker (default sweep and poll) re-claims them: p50/p99
 * from the kill to the new claim, against the lease; (4) the embedded default's stages/s (PGlite,
 * in-process worker, the in-process transport).
 */
async function scaleSection(bestFast4: number | undefined): Promise<void> {
  const t0 = performance.now();
  const load = () => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  const rows: string[] = [];
  const sweep: { procs: number; stagesPerS: number; cpu: Record<string, unknown>; ok: boolean; load: string }[] = [];
  const scaleRuns = Number(argv['scale-runs']);
  // --scale-concurrency: numbers and "best" (fast:4's best concurrency of the variants run above; skipped without one).
  const concs: number[] = [];
  for (const x of argv['scale-concurrency'].split(',').map((y) => y.trim())) {
    const c = x === 'best' ? bestFast4 : parseConcurrencies(x)[0];
    if (c !== undefined && !concs.includes(c)) concs.push(c);
  }
  for (const conc of concs)
    for (const procs of argv['scale-procs'].split(',').filter(Boolean).map(Number)) {
      const r = await runVariant('fast', procs, {
        concurrency: conc,
        runs: scaleRuns,
        light: false,
        warmupRuns: Number(argv['scale-warmup-runs']),
      });
      const cpu = r.info.cpu_ms_by_kind as Record<string, number>;
      const stages = r.info.stages_succeeded as number;
      const per = (ms: number) => round((ms ?? 0) / Math.max(stages, 1), 3);
      const entry = { procs, stagesPerS: r.stagesPerS, ok: r.allOk, load: load(), cpu };
      sweep.push(entry);
      out({
        metric: 'scale_stages_per_s',
        variant: `fast_path,procs=${procs}${conc === 10 ? '' : `,concurrency=${conc}`}`,
        value: round(r.stagesPerS, 1),
        unit: 'stages/s',
        info: {
          concurrency: conc,
          warmup_runs_per_process: Number(argv['scale-warmup-runs']),
          runs: scaleRuns,
          all_succeeded: r.allOk,
          cpu_ms_per_stage: {
            workers: per(cpu.ratchet_workers!),
            postgres_this_db: per(cpu.postgres_this_db!),
            postgres_background: per(cpu.postgres_background!),
          },
          cpu_ms_by_kind: cpu,
          cpu_busy_pct: r.info.cpu_busy_pct,
          loadavg: entry.load,
        },
      });
      rows.push(
        `fast path, ${String(procs).padStart(2)} proc, c=${String(conc).padEnd(3)} ${String(round(r.stagesPerS, 0)).padStart(8)} stages/s   cpu/stage: workers ${per(cpu.ratchet_workers!)} ms + postgres ${per(cpu.postgres_this_db!)} ms (+ bg ${per(cpu.postgres_background!)} ms)   ${r.allOk ? 'all ok' : 'NOT ALL OK'}   load ${entry.load}`,
      );
    }
  const parts = new Set(argv['scale-parts'].split(','));
  for (const n of !parts.has('claim') ? [] : argv['claim-1m'] ? [10_000, 1_000_000] : [10_000]) {
    const c = await claimLatency(n);
    rows.push(
      `claim, ${String(n).padStart(9)} waiting   p50 ${c.p50} ms  p99 ${c.p99} ms  (${c.samples} claims; bulk insert ${c.insertS} s)   load ${c.load}`,
    );
  }
  const rc = parts.has('reclaim') ? await reclaimLatency() : null;
  if (rc)
    rows.push(
      `reclaim after SIGKILL, lease ${rc.leaseMs} ms   p50 ${rc.p50} ms  p99 ${rc.p99} ms from the kill (p99 past the lease's end ${rc.pastLeaseP99} ms; ${rc.samples} stages)   load ${rc.load}`,
    );
  const pl = parts.has('pglite') ? await pgliteRate() : null;
  if (pl)
    rows.push(
      `embedded (PGlite, 1 in-process worker)   ${pl.stagesPerS} stages/s   (${pl.stages} stages, ${pl.ok ? 'all ok' : 'NOT ALL OK'})   load ${pl.load}`,
    );
  process.stderr.write(`\nhow it scales (${round((performance.now() - t0) / 1000, 0)} s):\n${rows.map((r) => `  ${r}`).join('\n')}\n`);
}

async function claimLatency(waiting: number): Promise<Record<string, unknown>> {
  const dbName = `bench_engine_claim_${waiting}`;
  const url = await createDb(cfg.adminUrl, dbName);
  const { openStore } = await import('../src/store/index.js');
  const store = await openStore({ databaseUrl: url, poolSize: 2 });
  try {
    const ti = performance.now();
    for (let done = 0; done < waiting; done += 200_000) await insertQueuedStagesAt(store.db, Math.min(200_000, waiting - done), done);
    await store.db.query('ANALYZE ratchet.stages');
    await store.db.query('ANALYZE ratchet.runs');
    const insertS = round((performance.now() - ti) / 1000, 1);
    const samples: number[] = [];
    const claims = Math.min(1000, Math.floor(waiting / 10));
    for (let i = 0; i < claims; i++) {
      const t = performance.now();
      const got = await store.claim({ owner: 'bench-claimer', toolClass: 'bench', limit: 1, definitions: ['h'] });
      samples.push(performance.now() - t);
      if (got.length !== 1) throw new Error(`claim ${i} with ${waiting} waiting got ${got.length} stages`);
    }
    const r = {
      waiting,
      samples: samples.length,
      p50: round(percentile(samples, 50)!, 2),
      p99: round(percentile(samples, 99)!, 2),
      insertS,
      load: readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' '),
    };
    out({ metric: 'claim_p50', variant: `waiting=${waiting}`, value: r.p50, unit: 'ms', info: r });
    out({ metric: 'claim_p99', variant: `waiting=${waiting}`, value: r.p99, unit: 'ms', info: r });
    log(`claim with ${waiting} waiting: p50 ${r.p50} ms p99 ${r.p99} ms (insert ${insertS} s)`);
    return r;
  } finally {
    await store.close();
    await dropDb(cfg.adminUrl, dbName);
  }
}

/** lib.ts's insertQueuedStages with run ids offset by `from` (so batches do not collide). */
async function insertQueuedStagesAt(db: Ratchet['store']['db'], count: number, from: number): Promise<void> {
  await db.query(
    `
    WITH r AS (
      INSERT INTO ratchet.runs (id, workflow, definition_hash, input, state)
      SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(i), 12, '0'))::uuid, 'bench', 'h', '{}'::jsonb, 'queued'
      FROM generate_series($3::int + 1, $3::int + $1::int) AS i
      RETURNING id
    )
    INSERT INTO ratchet.stages (run_id, definition_hash, seq, name, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms,
      max_attempts, idempotency_key, input, available_at)
    SELECT r.id, 'h', 1, 'noop', 'noop', $2, 'queued', 30000, 30000, 600000, 3, r.id::text || ':1:noop', '{}'::jsonb,
      ratchet.db_now() - interval '1 second'
    FROM r`,
    [count, 'bench', from],
  );
}

async function reclaimLatency(): Promise<Record<string, unknown>> {
  const { sleepy, SLEEPY_LEASE_MS } = await import('./workflows/noop.js');
  const dbName = 'bench_engine_reclaim';
  const url = await createDb(cfg.adminUrl, dbName);
  const prefix = `ratchet-bench-${randomBytes(4).toString('hex')}`;
  const perRound = 20;
  const rounds = 3;
  const workers: WorkerProc[] = [];
  let main: Ratchet | undefined;
  const admin = new pg.Client({ connectionString: url });
  const fromKill: number[] = [];
  const pastLease: number[] = [];
  try {
    let store: Ratchet['store'] | undefined;
    main = await createRatchet({
      databaseUrl: url,
      workflows: [sleepy],
      logger: silentLogger(),
      poolSize: 4,
      transport: createBullmqTransport({ redisUrl: cfg.redisUrl, prefix, logger: silentLogger(), dueIn: (id) => store!.dueIn(id) }),
    });
    store = main.store;
    await admin.connect();
    const env = (i: number) => ({
      DATABASE_URL: url,
      REDIS_URL: cfg.redisUrl,
      BULL_PREFIX: prefix,
      FAST_PATH: '1',
      CONCURRENCY: String(perRound),
      WORKFLOW: 'sleepy',
      WORKER_NAME: `reclaim-${i}`,
    });
    for (let round = 0; round < rounds; round++) {
      // A fresh pair each round: the victim claims every stage, then the survivor starts and the victim is killed.
      const victim = spawnWorker(round, env(round));
      const survivor = spawnWorker(100 + round, env(100 + round));
      workers.push(victim, survivor);
      await Promise.all([waitFor(victim, 'ready', 60_000), waitFor(survivor, 'ready', 60_000)]);
      victim.child.stdin.write('go\n');
      await waitFor(victim, 'started', 30_000);
      const ids: string[] = [];
      for (let i = 0; i < perRound; i++) ids.push((await main.submit('sleepy', {})).id);
      const owner = (victim.messages.find((m) => m.ready) as { owner: string }).owner;
      const until = Date.now() + 60_000;
      while (Date.now() < until) {
        const n = (
          await admin.query(
            `SELECT count(*)::int AS n FROM ratchet.stages WHERE run_id = ANY($1::uuid[]) AND owner_id = $2 AND state = 'running'`,
            [ids, owner],
          )
        ).rows[0].n;
        if (n === perRound) break;
        await sleep(50);
      }
      survivor.child.stdin.write('go\n');
      await waitFor(survivor, 'started', 30_000);
      victim.child.kill('SIGKILL');
      const killedAt = (await admin.query('SELECT ratchet.db_now() AS t')).rows[0].t as Date;
      const leases = new Map(
        (await admin.query(`SELECT id::text, lease_until FROM ratchet.stages WHERE run_id = ANY($1::uuid[])`, [ids])).rows.map((r) => [
          r.id as string,
          r.lease_until as Date,
        ]),
      );
      const until2 = Date.now() + 60_000;
      let reclaimed: { id: string; at: Date }[] = [];
      while (Date.now() < until2) {
        reclaimed = (
          await admin.query(
            `SELECT stage_id::text AS id, min(at) AS at FROM ratchet.events WHERE run_id = ANY($1::uuid[]) AND type IN ('job_claimed', 'lease_reclaimed') AND attempt >= 2 GROUP BY stage_id`,
            [ids],
          )
        ).rows as { id: string; at: Date }[];
        if (reclaimed.length === perRound) break;
        await sleep(50);
      }
      for (const r of reclaimed) {
        fromKill.push(r.at.getTime() - killedAt.getTime());
        pastLease.push(r.at.getTime() - leases.get(r.id)!.getTime());
      }
      log(`reclaim round ${round + 1}: ${reclaimed.length}/${perRound} re-claimed`);
      for (const id of ids) await main.cancel(id); // nothing left to reclaim in the next round
      survivor.child.kill('SIGKILL');
    }
  } finally {
    for (const w of workers) if (!w.exited) w.child.kill('SIGKILL');
    await admin.end().catch(() => {});
    await main?.close().catch(() => {});
    const q = new Queue(`class-${laneOf('sleepy', sleepy.hash)}`, { prefix, connection: redisConnection(cfg.redisUrl) });
    await q.obliterate({ force: true }).catch(() => {});
    await q.close().catch(() => {});
    await dropDb(cfg.adminUrl, dbName);
  }
  const r = {
    leaseMs: SLEEPY_LEASE_MS,
    samples: fromKill.length,
    p50: fromKill.length ? round(percentile(fromKill, 50)!, 0) : null,
    p99: fromKill.length ? round(percentile(fromKill, 99)!, 0) : null,
    pastLeaseP50: pastLease.length ? round(percentile(pastLease, 50)!, 0) : null,
    pastLeaseP99: pastLease.length ? round(percentile(pastLease, 99)!, 0) : null,
    load: readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' '),
    of: 'lease_reclaimed / job_claimed (attempt >= 2) at - the moment of SIGKILL (db clock); past lease = at - the lease_until the killed worker held',
  };
  out({ metric: 'reclaim_p50', variant: `lease=${SLEEPY_LEASE_MS}ms`, value: r.p50, unit: 'ms', info: r });
  out({ metric: 'reclaim_p99', variant: `lease=${SLEEPY_LEASE_MS}ms`, value: r.p99, unit: 'ms', info: r });
  return r;
}

async function pgliteRate(): Promise<{ stagesPerS: number; stages: number; ok: boolean; load: string }> {
  const runs = 100;
  const r = await createRatchet({ dataDir: ':memory:', workflows: [noop10], logger: silentLogger() });
  try {
    const ids: string[] = [];
    for (let i = 0; i < runs; i++) ids.push((await r.submit('noop10', {})).id);
    const w = r.worker({ concurrency: 10 });
    const t = performance.now();
    await w.start();
    const until = Date.now() + 300_000;
    let done = 0;
    while (Date.now() < until) {
      done = Number(
        (
          await r.store.db.query(`SELECT count(*)::int AS n FROM ratchet.runs WHERE state IN ('succeeded','failed','cancelled','expired')`)
        )[0]!.n,
      );
      if (done >= runs) break;
      await sleep(50);
    }
    const s = (performance.now() - t) / 1000;
    await w.stop({ graceMs: 2000 });
    const [st] = await r.store.db.query(`SELECT count(*) FILTER (WHERE state = 'succeeded')::int AS ok,
      extract(epoch FROM max(finished_at) - min(first_claimed_at))::float8 AS window_s FROM ratchet.stages`);
    const stages = st!.ok as number;
    const res = {
      stagesPerS: round(stages / ((st!.window_s as number) || s), 0),
      stages,
      ok: stages === runs * NOOP_STEPS,
      load: readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' '),
    };
    out({
      metric: 'pglite_stages_per_s',
      variant: 'embedded,1 in-process worker,concurrency=10',
      value: res.stagesPerS,
      unit: 'stages/s',
      info: res,
    });
    return res;
  } finally {
    await r.close();
  }
}

// ---- the live stream ----------------------------------------------------------------------------
/**
 * `--stream`: do watchers slow a run? bench/stream.ts part 1 in its own process (--stream-topology split: the
 * engine and its worker in it, the task API in another; one-process: all in it; the watchers in another): a run of a gate then 30 no-op stages, --stream-runs
 * rounds (default 5, +1 warm-up) of one run watched by 0 and one by N streams of GET /v1/runs/:id/stream per
 * priority of the watchers' process (--stream-watcher-priorities, default 19,0: niced, then not); its figures
 * (run_stages_per_s, stage_ms_p50, watched_over_unwatched, engine_cpu_us_per_event_per_watcher) are passed
 * through as engine lines, prefixed stream_.
 */
async function streamSection(): Promise<void> {
  const watchers = Number(argv['stream-watchers']);
  if (!Number.isInteger(watchers) || watchers < 1) throw new Error('--stream-watchers must be a positive whole number');
  const topology = argv['stream-topology'];
  if (topology !== 'split' && topology !== 'one-process') throw new Error('--stream-topology: split or one-process');
  log(`stream section: 0 vs ${watchers} watchers of one run, topology ${topology}`);
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      fileURLToPath(new URL('./stream.ts', import.meta.url)),
      '--only',
      'watchers',
      '--watchers',
      String(watchers),
      '--runs',
      String(Number(argv['stream-runs'])),
      '--watcher-priorities',
      argv['stream-watcher-priorities'],
      '--topology',
      topology,
      '--pg-url',
      cfg.adminUrl,
    ],
    { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const ratios: string[] = [];
  for await (const line of createInterface({ input: child.stdout })) {
    const l = JSON.parse(line) as Line & { bench: string };
    // watched_over_unwatched: the round-by-round ratio of stages/s (bench/stream.ts), one per watched variant.
    if (l.metric === 'watched_over_unwatched') ratios.push(`${l.variant} ${l.value}x`);
    out({ metric: `stream_${l.metric}`, variant: l.variant, value: l.value, unit: l.unit, info: l.info });
  }
  const code = await new Promise<number | null>((r) => (child.exitCode !== null ? r(child.exitCode) : child.on('exit', r)));
  if (code !== 0) throw new Error(`bench/stream.ts exited with ${code}`);
  process.stderr.write(
    `\nstream (topology ${topology}): one run's stages/s watched over unwatched (median of the rounds): ${ratios.join(', ')}\n`,
  );
}

// ---- main -------------------------------------------------------------------------------------
log(`bench:engine ${JSON.stringify({ ...cfg, quick: argv.quick, skipPeers: argv['skip-peers'] })}`);
{
  // Warm tsx's compile cache once, so no worker start pays for compiling.
  const t = performance.now();
  execFileSync(process.execPath, ['--import', 'tsx', cfg.workerScript, '--warm'], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
  log(`worker script loaded (tsx cache warm) in ${round((performance.now() - t) / 1000, 2)} s`);
}
const results: VariantResult[] = [];
const sectionOnly = argv['scale-only'] || argv['stream-only'];
if (!sectionOnly)
  // The light-load phase (idle workers, one run at a time) only at the first concurrency of the list: it is the
  // pick-up delay of an idle worker, not a throughput, and each costs ~10 s.
  for (const concurrency of cfg.concurrencies)
    for (const v of cfg.variants)
      results.push(
        await runVariant(v.mode, v.procs, {
          concurrency,
          noGrace: v.noGrace,
          light: !argv['skip-light'] && concurrency === cfg.concurrencies[0],
        }),
      );
const best = bestByVariant(results.map((r) => ({ ...r, allOk: r.measuredOk })));

let peerProcs: PeerProcsResult[] = [];
if (!argv['skip-peers'] && !sectionOnly) {
  const peers = await runPeers();
  if (!argv['skip-peer-procs']) {
    // The yardstick for "more processes never slower": the peers on this machine at 1 and 4 worker processes, at the
    // concurrencies of the check (graphile-worker at 10, as the history's key; BullMQ at 50, as run.sh's best).
    peerProcs = runPeersMoreProcs({
      pgUrl: cfg.adminUrl,
      redisUrl: cfg.redisUrl,
      rounds: cfg.peerProcsRounds,
      procs: 4,
      points: [
        { peer: 'graphile', concurrency: 10, jobs: 20_000 },
        { peer: 'bullmq', concurrency: 50, jobs: 20_000 },
      ],
    });
    for (const r of peerProcs)
      out({
        metric: 'peer_more_procs',
        variant: `${r.peer},concurrency=${r.concurrency}`,
        value: r.ratio,
        unit: 'x (4 processes over 1, median of the rounds)',
        info: { jobs_per_s_by_procs: r.median, ratios: r.ratios, trials: r.trials },
      });
  }
  const find = (measure: string, metric: string, pick: (variant: string) => boolean): PeerLine | null => {
    const cands = peers.filter((p) => p.measure === measure && p.metric === metric && pick(p.variant) && p.median != null);
    return cands.sort((a, b) => b.median! - a.median!)[0] ?? null;
  };
  const targets: { key: string; peer: PeerLine | null; goal: number | null; note: string }[] = [
    {
      key: 'dbos_steps',
      peer: find('dbos', 'steps_per_s', () => true),
      goal: 1,
      note: 'DBOS Transact steps/s, 10-step workflows (best of direct / queue)',
    },
    {
      key: 'graphile_jobs',
      peer: find('graphile', 'process_jobs_per_s', () => true),
      goal: 1,
      note: 'graphile-worker jobs/s (best concurrency)',
    },
    {
      key: 'pgboss_batch1_jobs',
      peer: find('pgboss', 'process_jobs_per_s', (v) => v.startsWith('batch=1 ')),
      goal: 1,
      note: 'pg-boss jobs/s at one job per fetch',
    },
    {
      key: 'pgboss_batch100_jobs',
      peer: find('pgboss', 'process_jobs_per_s', (v) => v.startsWith('batch=100 ')),
      goal: 1,
      note: 'pg-boss jobs/s at 100 per fetch (stretch)',
    },
    {
      key: 'bullmq_jobs',
      peer: find('bullmq', 'process_jobs_per_s', () => true),
      goal: null,
      note: 'BullMQ jobs/s (best concurrency), no durability in PostgreSQL',
    },
    {
      key: 'pgbench_update_tps_c4',
      peer: find('pgbench-update', 'tps', (v) => v === 'clients=4'),
      goal: 0.5,
      note: 'pgbench single-row UPDATE tps at 4 clients (commit rate)',
    },
  ];
  for (const p of peers) {
    if (!['steps_per_s', 'process_jobs_per_s', 'tps'].includes(p.metric)) continue;
    out({
      metric: 'peer',
      variant: `${p.measure} ${p.variant} ${p.metric}`,
      value: p.median,
      unit: p.unit,
      info: {
        runs: p.runs,
        cpu_busy_pct: p.cpu_busy_pct,
        xacts_per_item: p.xacts_per_item,
        wal_fsyncs_per_item: p.wal_fsyncs_per_item,
        failed_runs: p.failed_runs,
        errors: p.errors,
      },
    });
  }
  const summary: string[] = [];
  // At concurrency 10 under the history's keys (fast_path,procs=4 / graphile_jobs); at each variant's best
  // concurrency under <variant>,best_concurrency (info.concurrency says which).
  const ratioRows: { r: VariantResult; key: string }[] = [
    ...results.filter((x) => x.mode === 'fast' && x.concurrency === 10).map((r) => ({ r, key: r.base })),
    ...[...best.values()].filter((x) => x.mode === 'fast').map((r) => ({ r, key: `${r.base},best_concurrency` })),
  ];
  for (const { r, key } of ratioRows) {
    for (const t of targets) {
      if (!t.peer?.median) {
        out({
          metric: 'ratio',
          variant: `${key} / ${t.key}`,
          value: null,
          unit: 'x',
          info: { concurrency: r.concurrency, note: `${t.note}: no figure from the peers run` },
        });
        continue;
      }
      const ratio = r.stagesPerS / t.peer.median;
      out({
        metric: 'ratio',
        variant: `${key} / ${t.key}`,
        value: round(ratio, 3),
        unit: 'x',
        info: {
          concurrency: r.concurrency,
          ratchet_stages_per_s: round(r.stagesPerS, 1),
          ratchet_cpu_ms_per_stage: r.cpu,
          peer: `${t.peer.measure} ${t.peer.variant}`,
          peer_value: t.peer.median,
          peer_unit: t.peer.unit,
          peer_cpu_busy_pct: t.peer.cpu_busy_pct,
          ratchet_cpu_busy_pct: r.info.cpu_busy_pct,
          goal: t.goal === null ? null : `>= ${t.goal}`,
          goal_met: t.goal === null ? null : ratio >= t.goal,
          ratchet_all_succeeded: r.allOk,
          ratchet_warmup_runs_per_process: cfg.warmupRuns,
          peer_warmup: 'none: run.sh times each library from its start (pool, first plans) over its 20,000 jobs',
          note: t.note,
        },
      });
      summary.push(
        `${`${r.base},c=${r.concurrency}${key.endsWith('best_concurrency') ? ' (best)' : ''}`.padEnd(30)} / ${t.key.padEnd(22)} ${String(round(ratio, 3)).padStart(7)}  (${round(r.stagesPerS, 0)} vs ${t.peer.median} ${t.peer.unit}; ${r.procs * r.concurrency} stages in flight vs the peer's ${t.peer.variant}${t.goal === null ? '' : `; goal >= ${t.goal}: ${ratio >= t.goal ? 'met' : 'NOT met'}`}${r.allOk ? '' : '; NOT ALL RUNS SUCCEEDED'})`,
      );
    }
  }
  process.stderr.write(`\nratios (fast path stages/s over the peer's figure):\n${summary.join('\n')}\n`);
}

/** The warm-up's CPU per stage (its first runs per process), next to the measured window's. */
const warmNote = (r: VariantResult): string => {
  const w = (r.info.warmup as { cpu_ms_per_stage?: { total: number; workers: number; postgres: number } } | undefined)?.cpu_ms_per_stage;
  return w ? `   warm-up: ${w.total} = ${w.workers} + ${w.postgres}` : '';
};
if (results.length) {
  process.stderr.write(
    `\n${'variant'.padEnd(36)}${'stages/s'.padStart(10)}${'runs/s'.padStart(9)}${'p50 ms'.padStart(9)}${'p99 ms'.padStart(9)}${'light p50'.padStart(11)}${'light p99'.padStart(11)}${'cpu%'.padStart(7)}${'xact/st'.padStart(9)}  all ok\n`,
  );
  for (const r of results) {
    const light = r.info.light as Record<string, unknown>;
    process.stderr.write(
      `${r.label.padEnd(36)}${String(round(r.stagesPerS, 0)).padStart(10)}${String(round(r.runsPerS, 1)).padStart(9)}` +
        `${String(r.info.pickup_p50_ms ?? '').padStart(9)}${String(r.info.pickup_p99_ms ?? '').padStart(9)}${String(light.pickup_p50_ms ?? '').padStart(11)}${String(light.pickup_p99_ms ?? '').padStart(11)}` +
        `${String(r.info.cpu_busy_pct).padStart(7)}${String(r.info.xacts_per_stage).padStart(9)}  ${r.allOk}\n`,
    );
  }
  process.stderr.write(
    `\nCPU ms per stage (workers + PostgreSQL backends of the bench db, measured window${cfg.warmupRuns ? `, after a warm-up of ${cfg.warmupRuns} runs per process` : ', no warm-up'}):\n`,
  );
  for (const r of results)
    process.stderr.write(
      `  ${r.label.padEnd(36)} ${String(r.cpu.total).padStart(6)} ms = workers ${r.cpu.workers} + postgres ${r.cpu.postgres}   (${round(r.stagesPerS, 0)} stages/s)${warmNote(r)}\n`,
    );
  const bestRows = [...best.values()].map((r) => `${r.base} c=${r.concurrency} ${round(r.stagesPerS, 0)}`);
  process.stderr.write(`best concurrency per variant (of ${cfg.concurrencies.join(', ')}): ${bestRows.join('; ')}\n`);
  for (const r of best.values())
    out({
      metric: 'best_concurrency',
      variant: r.base,
      value: r.concurrency,
      unit: 'stages at once per process',
      info: { stages_per_s: round(r.stagesPerS, 1), cpu_ms_per_stage: r.cpu, of: cfg.concurrencies, all_succeeded: r.allOk },
    });
  const checks = moreProcsChecks(results);
  for (const c of checks) {
    const v = `${c.mode === 'fast' ? 'fast_path' : 'bullmq'},concurrency=${c.concurrency}`;
    out({
      metric: 'check_more_procs_not_slower',
      variant: v,
      value: c.ok,
      unit: 'bool',
      info: { stages_per_s_by_procs: Object.fromEntries(c.points.map(([p, x]) => [p, round(x, 1)])), ratios: c.ratios },
    });
    process.stderr.write(
      `check more processes never slower, ${v}: ${c.ok ? 'ok' : 'FAILED'}   ${c.points.map(([p, x]) => `${p} proc ${round(x, 0)}`).join(' -> ')} (x${c.ratios.join(', x')})\n`,
    );
  }
  if (peerProcs.length)
    process.stderr.write(
      `the peers on this machine, 4 worker processes over 1 (median of ${cfg.peerProcsRounds} rounds, each a pair): ${peerProcs
        .map(
          (r) =>
            `${r.peer} c=${r.concurrency} x${r.ratio} (${Math.round(r.median[1]!)} -> ${Math.round(r.median[4]!)} jobs/s; rounds x${r.ratios.join(', x')})`,
        )
        .join('; ')}\n`,
    );
}
if (argv.scale || argv['scale-only']) await scaleSection(best.get(label('fast', 4))?.concurrency);
if (argv.stream || argv['stream-only']) await streamSection();
log('done');
process.exit(0);
