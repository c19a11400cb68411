/**
 * One worker process of the engine benchmark (bench/engine.ts), configured by the environment:
 *   DATABASE_URL, REDIS_URL, BULL_PREFIX (BullMQ key prefix, fresh per variant), FAST_PATH=0|1,
 *   CONCURRENCY (stages at once, default 10), POOL_SIZE (default 10), FINISH_BATCH_MS (default: the engine's),
 *   POLL_MS (default: the engine's), SWEEP_MS (default: the engine's), WORKER_NAME, WORKFLOW=sleepy (the reclaim
 *   measurement's workflow instead of noop10).
 *
 *   node --import tsx bench/worker-process.ts           # tsx compiles once into its cache
 *   node --import tsx bench/worker-process.ts --warm    # load everything and exit (warms the cache)
 *
 * Protocol (JSON lines on stdout; logs on stderr): after connecting and migrating it prints
 * {"ready":true}; the line "go" on stdin starts the worker ({"started":true}); the line "stop"
 * (or SIGTERM) stops it gracefully and prints {"stopped":true,...} with what it saw: attempt
 * ends, statements by name (count, rows, total ms), wake-ups sent and received, and its own CPU.
 * Before "go", optionally: "warm" ({"warming":true}) and "rest" ({"rested":true}), see below.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createInterface } from 'node:readline';
import { performance } from 'node:perf_hooks';
import pino from 'pino';
import { createRatchet, type Ratchet } from '../src/engine.js';
import { createBullmqTransport } from '../src/transport/bullmq.js';
import type { Transport } from '../src/transport/transport.js';
import { noop10, sleepy } from './workflows/noop.js';

if (process.argv.includes('--warm')) process.exit(0);

const env = (name: string, dflt?: string): string => {
  const v = process.env[name] ?? dflt;
  if (v === undefined) throw new Error(`${name} is required`);
  return v;
};
const optInt = (name: string): number | undefined => (process.env[name] ? Number(process.env[name]) : undefined);
const send = (msg: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(msg)}\n`);

const name = env('WORKER_NAME', 'bench');
const logger = pino({ level: process.env.RATCHET_LOG_LEVEL ?? 'warn', base: { worker: name } }, pino.destination(2));

// Statement profile: every store statement by its prepared name (claims by limit folded together).
const stmts: Record<string, { n: number; rows: number; ms: number; maxMs: number; fast?: number }> = {};
const wakes = { notified: 0, received: 0 };

let ratchet: Ratchet | undefined;
const bull = createBullmqTransport({
  redisUrl: env('REDIS_URL'),
  prefix: env('BULL_PREFIX'),
  logger,
  dueIn: (stageId) => ratchet!.store.dueIn(stageId),
});
const transport: Transport = {
  kind: bull.kind,
  notify(toolClass, ready, delayMs) {
    wakes.notified++;
    bull.notify(toolClass, ready, delayMs);
  },
  subscribe: (toolClass, onWake, opts) =>
    bull.subscribe(
      toolClass,
      (ready) => {
        wakes.received++;
        return onWake(ready);
      },
      opts,
    ),
  healthy: () => bull.healthy(),
  close: () => bull.close(),
};

ratchet = await createRatchet({
  databaseUrl: env('DATABASE_URL'),
  workflows: process.env.WORKFLOW === 'sleepy' ? [sleepy] : [noop10], // sleepy: the reclaim measurement (--scale)
  logger,
  transport,
  poolSize: optInt('POOL_SIZE') ?? 10,
});

// Load ioredis now (BullMQ requires it lazily when the worker starts): its module loading is not a stage's cost.
createRequire(createRequire(import.meta.url).resolve('bullmq'))('ioredis');
// SWEEP_GRACE=0 (variant flag "nograce"): the sweeper re-sends queued stages at once, as before issue 14's cut (A/B in one bench).
if (process.env.SWEEP_GRACE === '0') {
  const store = ratchet.store;
  const sweep = store.sweep.bind(store);
  store.sweep = (lanes, limit) => sweep(lanes, limit, 0);
}

const db = ratchet.store.db;
const rawQuery = db.query.bind(db);
const profiled = async (text: string, params?: readonly unknown[], stmtName?: string): Promise<Record<string, unknown>[]> => {
  const key = stmtName ? stmtName.replace(/^ratchet_/, '').replace(/_\d+$/, '') : 'unnamed';
  const t0 = performance.now();
  try {
    const rows = await rawQuery(text, params, stmtName);
    const s = (stmts[key] ??= { n: 0, rows: 0, ms: 0, maxMs: 0 });
    const ms = performance.now() - t0;
    s.n++;
    s.rows += rows.length;
    s.ms += ms;
    s.maxMs = Math.max(s.maxMs, ms);
    if (key === 'finish') s.fast = (s.fast ?? 0) + rows.filter((r) => r.next_claimed != null).length;
    return rows;
  } catch (err) {
    const s = (stmts[`${key}_error`] ??= { n: 0, rows: 0, ms: 0, maxMs: 0 });
    s.n++;
    throw err;
  }
};
(db as { query: unknown }).query = profiled;

const fastPath = env('FAST_PATH', '1') !== '0';
const makeWorker = () =>
  ratchet!.worker({
    name,
    fastPath,
    concurrency: optInt('CONCURRENCY') ?? 10,
    ...(optInt('FINISH_BATCH_MS') !== undefined ? { finishBatchMs: optInt('FINISH_BATCH_MS') } : {}),
    ...(optInt('POLL_MS') !== undefined ? { pollIntervalMs: optInt('POLL_MS') } : {}),
    ...(optInt('SWEEP_MS') !== undefined ? { sweepIntervalMs: optInt('SWEEP_MS') } : {}),
    graceMs: 2000,
  });
let worker = makeWorker();
send({ ready: true, owner: worker.owner, pid: process.pid, fastPath });

/** CPU ms of the main thread and of the others (V8's compiler and GC helpers, libuv's pool) from /proc (Linux only). */
function threadCpuMs(): Record<string, number> {
  const out: Record<string, number> = {};
  try {
    for (const tid of readdirSync('/proc/self/task')) {
      const stat = readFileSync(`/proc/self/task/${tid}/stat`, 'utf8');
      const close = stat.lastIndexOf(')');
      const comm = Number(tid) === process.pid ? 'main' : 'other_threads'; // Node 20 names every thread 'node'
      const f = stat.slice(close + 2).split(' ');
      out[comm] = (out[comm] ?? 0) + (Number(f[11]) + Number(f[12])) * 10; // utime + stime, 100 ticks/s
    }
    const status = readFileSync(`/proc/self/task/${process.pid}/status`, 'utf8');
    out.main_switches_voluntary = Number(/voluntary_ctxt_switches:\s+(\d+)/.exec(status)?.[1] ?? 0);
    out.main_switches_involuntary = Number(/nonvoluntary_ctxt_switches:\s+(\d+)/.exec(status)?.[1] ?? 0);
  } catch {
    /* not Linux */
  }
  return out;
}
let threads0 = threadCpuMs();
let cpu0 = process.cpuUsage();
let t0 = performance.now();
let started = false;
let stopping: Promise<void> | null = null;

function stop(): Promise<void> {
  stopping ??= (async () => {
    const cpu = process.cpuUsage(cpu0);
    const threads = threadCpuMs();
    for (const [k, v] of Object.entries(threads0)) threads[k] = (threads[k] ?? 0) - v;
    const wallMs = performance.now() - t0;
    await worker.stop({ graceMs: 2000 });
    await ratchet!.close();
    const round = (v: number) => Math.round(v * 10) / 10;
    send({
      stopped: true,
      owner: worker.owner,
      ended: worker.ended,
      wakes,
      cpu_ms: { user: round(cpu.user / 1000), system: round(cpu.system / 1000) },
      thread_cpu_ms: threads,
      db_lanes: worker.dbLanes.width === Infinity ? 'off' : worker.dbLanes.width,
      wall_ms: round(wallMs),
      statements: Object.fromEntries(
        Object.entries(stmts).map(([k, s]) => [
          k,
          { n: s.n, rows: s.rows, ms: round(s.ms), max_ms: round(s.maxMs), ...(s.fast !== undefined ? { next_claimed: s.fast } : {}) },
        ]),
      ),
    });
    process.exit(0);
  })();
  return stopping;
}

/**
 * Warm-up (bench/engine.ts --warmup-runs): "warm" starts a worker on the runs the bench submitted for it; "rest"
 * stops it once they are done and makes a fresh one (not started), keeping the process, its pool's connections (their
 * backends' plans and caches) and V8's compiled code; until "go" the pool's connections are kept open (pg's pool
 * closes an idle client (src/store/db-postgres.ts: after 60 s), and a service under load never idles them).
 */
let warming = false;
let keepOpen: NodeJS.Timeout | undefined;
const poolSize = optInt('POOL_SIZE') ?? 10;
const input = createInterface({ input: process.stdin });
input.on('close', () => void stop()); // the bench went away: do not linger
input.on('line', (line) => {
  const cmd = line.trim();
  if (cmd === 'warm' && !started && !warming) {
    warming = true;
    void worker.start().then(() => send({ warming: true }));
  } else if (cmd === 'rest' && warming) {
    warming = false;
    void (async () => {
      await worker.stop({ graceMs: 2000 });
      worker = makeWorker();
      const touch = () => Promise.all(Array.from({ length: poolSize }, () => rawQuery('SELECT 1'))).catch(() => {});
      await touch();
      keepOpen = setInterval(() => void touch(), 3000);
      send({ rested: true, owner: worker.owner });
    })();
  } else if (cmd === 'go' && !started && !warming) {
    started = true;
    clearInterval(keepOpen);
    for (const k of Object.keys(stmts)) delete stmts[k]; // count only the measured phase
    wakes.notified = 0;
    wakes.received = 0;
    cpu0 = process.cpuUsage();
    threads0 = threadCpuMs();
    t0 = performance.now();
    void worker.start().then(() => send({ started: true }));
  } else if (cmd === 'stop') {
    clearInterval(keepOpen);
    void stop();
  }
});
process.on('SIGTERM', () => void stop());
