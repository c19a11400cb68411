/**
 * Live-stream benchmark (not a test): `npm run bench:stream -- [--watchers N] [--runs R] [--stages S] [--throughput-runs T]
 *   [--only watchers|notify|throughput] [--pg-url URL]`; `npm run bench -- --stream` runs part 1 as a section of the engine bench.
 * stdout: one JSON line per figure, {"bench":"stream","metric","variant","value","unit","info"}; stderr: progress.
 * One process runs the engine, a worker (in-process wake-ups) and the task API on PostgreSQL, like `ratchet serve`
 * beside a worker; the watchers are another process (bench/stream-watchers.ts) so their CPU is not counted as the engine's.
 *   1. Do watchers slow a run? R runs of a gate stage then S no-op stages, each watched by 0 and then by N server-sent
 *      event streams (all connected before the gate opens): the time from the gate's release to the run's end, per stage,
 *      p50 over the runs; and every watcher got every event (fewest / most events per watcher).
 *   2. Does pg_notify cost throughput? The events trigger notifies once per statement per run, and PostgreSQL takes a
 *      global lock when a transaction that notified commits, so such commits go one at a time. T runs of 10 no-op stages
 *      at once (worker concurrency 8), stages/s from the first claim to the last finish, with the trigger enabled and
 *      disabled (ALTER TABLE ... DISABLE TRIGGER), alternated twice.
 *   3. The lock alone: pgbench, 8 clients, 10 s each: a single-row update per transaction, and the same with a
 *      pg_notify in it (distinct payloads, as the trigger sends one per run).
 * Each variant uses its own database bench_stream_* and drops it afterwards.
 */
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { z } from 'zod';
import { createServer } from '../src/api/server.js';
import { defineTool, defineToolClass, defineWorkflow } from '../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../src/engine.js';
import { silentLogger } from '../src/logger.js';
import { readFileSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { createDb, dropDb, emit, log, percentile, pgbenchTps, round } from './lib.js';

const { values: argv } = parseArgs({
  options: {
    watchers: { type: 'string', default: '50' },
    runs: { type: 'string', default: '5' },
    stages: { type: 'string', default: '30' },
    'throughput-runs': { type: 'string', default: '300' },
    /** One part only: watchers (1), notify (3, pgbench), throughput (2). */
    only: { type: 'string' },
    'pg-url': { type: 'string', default: process.env.RATCHET_BENCH_PG_URL ?? 'postgres://root@127.0.0.1:5432/test' },
  },
});
const cfg = {
  watchers: Number(argv.watchers),
  runs: Number(argv.runs),
  stages: Number(argv.stages),
  throughputRuns: Number(argv['throughput-runs']),
  adminUrl: argv['pg-url'],
};
const TOKEN = 'bench-stream-token-0123';

const cls = defineToolClass({ name: 'bench-stream', lease: '30s', heartbeat: '10s', timeout: '30s', maxDuration: '1m' });
const gates = new Map<string, () => void>();
const gate = defineTool({
  name: 'gate',
  description: 'waits for the bench',
  class: cls,
  input: z.object({ key: z.string() }),
  output: z.object({}),
  run: (i) => new Promise((resolve) => gates.set(i.key, () => resolve({}))),
});
const noop = defineTool({
  name: 'noop',
  description: 'nothing',
  class: cls,
  input: z.object({}).passthrough(),
  output: z.object({}),
  run: async () => ({}),
});
const watched = defineWorkflow({
  name: 'watched',
  input: z.object({ key: z.string() }),
  steps: [{ tool: gate }, ...Array.from({ length: cfg.stages }, (_, i) => ({ tool: noop, name: `s${i + 1}`, input: () => ({}) }))],
});
const ten = defineWorkflow({
  name: 'ten',
  input: z.object({}),
  steps: Array.from({ length: 10 }, (_, i) => ({ tool: noop, name: `s${i + 1}` })),
});

async function withEngine<T>(name: string, fn: (r: Ratchet, url: string, dbUrl: string) => Promise<T>): Promise<T> {
  const dbUrl = await createDb(cfg.adminUrl, name);
  const ratchet = await createRatchet({ databaseUrl: dbUrl, workflows: [watched, ten], logger: silentLogger(), poolSize: 12 });
  const server = await createServer({ ratchet, tokens: [TOKEN], port: 0 });
  try {
    return await fn(ratchet, server.url, dbUrl);
  } finally {
    await server.close();
    await ratchet.close();
    await dropDb(cfg.adminUrl, name);
  }
}

const until = async (what: string, fn: () => Promise<boolean>, ms = 120_000) => {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
};

async function watchersBench(): Promise<void> {
  const child = spawn(process.execPath, ['--import', 'tsx', fileURLToPath(new URL('./stream-watchers.ts', import.meta.url))], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const lines = createInterface({ input: child.stdout });
  // utime + stime of the watchers' process from /proc (clock ticks of 10 ms); 0 where /proc is missing.
  const watcherCpuMs = (): number => {
    try {
      const f = readFileSync(`/proc/${child.pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
      return (Number(f[11]) + Number(f[12])) * 10;
    } catch {
      return 0;
    }
  };
  const waiting = new Map<string, (words: string[]) => void>();
  lines.on('line', (l) => {
    const words = l.split(' ');
    waiting.get(`${words[0]} ${words[1]}`)?.(words);
  });
  const expect = (kind: string, runId: string) => new Promise<string[]>((resolve) => waiting.set(`${kind} ${runId}`, resolve));
  try {
    await withEngine('bench_stream_watchers', async (ratchet, url, dbUrl) => {
      await ratchet.worker({ pollIntervalMs: 50, concurrency: 4 }).start();
      // Reads of the events table (index + sequential scans, pg_stat_user_tables): what the streams ask the database.
      const eventReads = async () => {
        await new Promise((r) => setTimeout(r, 1200)); // the backends' statistics reach the shared counters within a second
        const [r] = await ratchet.store.db.query(
          `SELECT (coalesce(idx_scan, 0) + coalesce(seq_scan, 0))::bigint AS n FROM pg_stat_user_tables WHERE schemaname = 'ratchet' AND relname = 'events'`,
        );
        return Number(r?.n ?? 0);
      };
      // The stream's own statements, counted where the server sends them (the store's queryable, which the
      // stream route uses), and the notifications of the watched run (a LISTEN of our own): reads per
      // notification, from the gate's release to the last watcher's end.
      const streamStatements = new Map<string, number>();
      const db = ratchet.store.db as { query: (...a: unknown[]) => Promise<unknown[]> };
      const query = db.query.bind(db);
      db.query = (...a: unknown[]) => {
        const name = a[2];
        if (typeof name === 'string' && name.startsWith('ratchet_stream'))
          streamStatements.set(name, (streamStatements.get(name) ?? 0) + 1);
        return query(...a);
      };
      const stmt = (name: string) => streamStatements.get(name) ?? 0;
      const pg = (await import('pg')).default;
      const listen = new pg.Client({ connectionString: dbUrl });
      const notes = new Map<string, number>();
      listen.on('notification', (m) => notes.set(m.payload ?? '', (notes.get(m.payload ?? '') ?? 0) + 1));
      await listen.connect();
      await listen.query('LISTEN ratchet_events');
      for (const n of [0, cfg.watchers]) {
        const reads0 = await eventReads();
        const timedReads: number[] = [];
        const timedEndChecks: number[] = [];
        const notifications: number[] = [];
        const perStage: number[] = [];
        const stagesPerS: number[] = [];
        const cpuMs: number[] = [];
        const watcherCpuMsRuns: number[] = [];
        let fewest = Infinity;
        let most = 0;
        for (let i = 0; i < cfg.runs + 1; i++) {
          // the first run warms up and is not counted
          const key = `w${n}-${i}`;
          const { id } = await ratchet.submit('watched', { key });
          let done: Promise<string[]> | null = null;
          if (n > 0) {
            const open = expect('open', id);
            done = expect('done', id);
            child.stdin.write(`watch ${url} ${TOKEN} ${id} ${n}\n`);
            await open;
          }
          await until('the gate', async () => gates.has(key));
          const t0 = performance.now();
          const reads0Run = stmt('ratchet_stream_events');
          const checks0Run = stmt('ratchet_stream_end_check');
          const notes0 = notes.get(id) ?? 0;
          const cpu0 = process.cpuUsage();
          const watcherCpu0 = watcherCpuMs();
          gates.get(key)!();
          await until(
            'the run to end',
            async () => (await ratchet.store.db.query(`SELECT 1 FROM ratchet.runs WHERE id = $1 AND state = 'succeeded'`, [id])).length > 0,
          );
          const ms = performance.now() - t0;
          const cpu = process.cpuUsage(cpu0);
          let watcherCpu = watcherCpuMs() - watcherCpu0;
          if (done) {
            const [, , lo, hi] = await done;
            fewest = Math.min(fewest, Number(lo));
            most = Math.max(most, Number(hi));
            const [{ n: count }] = (await ratchet.store.db.query(`SELECT count(*)::int AS n FROM ratchet.events WHERE run_id = $1`, [
              id,
            ])) as [{ n: number }];
            if (Number(lo) !== count) log(`a watcher of ${id} got ${lo} events of ${count}`);
            watcherCpu = watcherCpuMs() - watcherCpu0;
          }
          if (i > 0) {
            timedReads.push(stmt('ratchet_stream_events') - reads0Run);
            timedEndChecks.push(stmt('ratchet_stream_end_check') - checks0Run);
            notifications.push((notes.get(id) ?? 0) - notes0);
            cpuMs.push((cpu.user + cpu.system) / 1000);
            watcherCpuMsRuns.push(watcherCpu);
            perStage.push(ms / cfg.stages);
            stagesPerS.push((cfg.stages * 1000) / ms);
          }
          log(`${n} watchers: run ${i} took ${round(ms)} ms for ${cfg.stages} stages`);
        }
        emit('stream', {
          metric: 'stage_ms_p50',
          variant: `${n}_watchers`,
          value: round(percentile(perStage, 50)!),
          unit: 'ms',
          info: {
            runs: cfg.runs,
            stages: cfg.stages,
            perStage: perStage.map((v) => round(v)),
            ...(n > 0 ? { eventsPerWatcherMin: fewest, eventsPerWatcherMax: most } : {}),
          },
        });
        const eventReadsPerRun = ((await eventReads()) - reads0) / (cfg.runs + 1);
        // The same runs as a rate: the watched run's stages per second, median over the runs.
        emit('stream', {
          metric: 'run_stages_per_s',
          variant: `${n}_watchers`,
          value: round(percentile(stagesPerS, 50)!),
          unit: 'stages/s',
          info: {
            runs: cfg.runs,
            stages: cfg.stages,
            perRun: stagesPerS.map((v) => round(v)),
            // CPU of this process (engine + worker + API, streams included) per run, ms: what the watchers cost the engine itself.
            engineCpuMsPerRun: cpuMs.map((v) => round(v)),
            eventReadsPerRun: round(eventReadsPerRun, 1),
            // From the gate's release to the last watcher's end: the stream's reads and end checks, and the run's notifications.
            streamReadsPerRun: timedReads,
            streamEndChecksPerRun: timedEndChecks,
            notificationsPerRun: notifications,
            // CPU of the watchers' own process per run, ms (on a 2-core machine it competes with the engine for the cores).
            watcherProcessCpuMsPerRun: watcherCpuMsRuns.map((v) => round(v)),
            loadavg1: round(loadavg()[0]!, 2),
          },
        });
      }
      await listen.end();
    });
  } finally {
    child.kill();
  }
}

async function throughputOnce(trigger: boolean, round_: number): Promise<void> {
  await withEngine(`bench_stream_notify_${trigger ? 'on' : 'off'}`, async (ratchet) => {
    if (!trigger) await ratchet.store.db.query('ALTER TABLE ratchet.events DISABLE TRIGGER events_notify');
    await Promise.all(Array.from({ length: cfg.throughputRuns }, () => ratchet.submit('ten', {})));
    const worker = ratchet.worker({ pollIntervalMs: 20, concurrency: 8 });
    await worker.start();
    await until(
      'every run to end',
      async () => (await ratchet.store.db.query(`SELECT 1 FROM ratchet.runs WHERE state <> 'succeeded' LIMIT 1`)).length === 0,
      600_000,
    );
    const [r] = await ratchet.store.db.query(
      `SELECT count(*)::int AS n, extract(epoch FROM max(finished_at) - min(first_claimed_at)) AS s FROM ratchet.stages`,
    );
    const stagesPerS = round((r!.n as number) / Number(r!.s));
    log(`trigger ${trigger ? 'on' : 'off'} (round ${round_}): ${r!.n} stages in ${round(Number(r!.s), 2)} s = ${stagesPerS} stages/s`);
    emit('stream', {
      metric: 'stages_per_s',
      variant: `notify_trigger_${trigger ? 'on' : 'off'}`,
      value: stagesPerS,
      unit: 'stages/s',
      info: { round: round_, runs: cfg.throughputRuns, concurrency: 8 },
    });
    await worker.stop({ graceMs: 1000 });
  });
}

async function notifyLockBench(): Promise<void> {
  const plain = join(tmpdir(), 'ratchet-bench-update.sql');
  const notify = join(tmpdir(), 'ratchet-bench-update-notify.sql');
  writeFileSync(plain, '\\set id random(1, 100000)\nUPDATE kv SET v = v + 1 WHERE id = :id;\n');
  writeFileSync(
    notify,
    "\\set id random(1, 100000)\nBEGIN;\nUPDATE kv SET v = v + 1 WHERE id = :id;\nSELECT pg_notify('ratchet_bench', :id::text);\nCOMMIT;\n",
  );
  for (const [variant, script] of [
    ['update', plain],
    ['update_notify', notify],
  ] as const) {
    const r = await pgbenchTps(cfg.adminUrl, script, 8, 10);
    log(`pgbench ${variant}: ${r.tps} tps, ${r.latencyMs} ms`);
    emit('stream', {
      metric: 'pgbench_tps',
      variant,
      value: round(r.tps),
      unit: 'tps',
      info: { clients: 8, seconds: 10, latencyMs: r.latencyMs },
    });
  }
}

const only = argv.only;
if (only !== undefined && !['watchers', 'notify', 'throughput'].includes(only)) throw new Error('--only: watchers, notify or throughput');
if (!only || only === 'watchers') await watchersBench();
if (!only || only === 'notify') await notifyLockBench();
if (!only || only === 'throughput')
  for (const r of [1, 2]) {
    await throughputOnce(true, r);
    await throughputOnce(false, r);
  }
