/**
 * Live-stream benchmark (not a test): `npm run bench:stream -- [--watchers N] [--runs R] [--stages S] [--throughput-runs T]
 *   [--only watchers|notify|throughput] [--pg-url URL] [--watcher-priorities 19,0] [--topology split|one-process]`; `npm run bench -- --stream` runs part 1 as a
 *   section of the engine bench.
 * stdout: one JSON line per figure, {"bench":"stream","metric","variant","value","unit","info"}; stderr: progress.
 * Part 1's topology (--topology, default split): `split` runs the engine with its worker (in-process wake-ups: the fast
 * path hands each next stage in the same statement) in this process and the task API the watchers connect to in another
 * (bench/stream-api.ts, an engine with no worker, on the same database; the events reach it by LISTEN/NOTIFY), as
 * `ratchet worker` and `ratchet serve` are deployed; `one-process` runs the engine, the worker and the task API in this
 * one process (the streams' socket writes then share the worker's event loop). The watchers are always a process of
 * their own (bench/stream-watchers.ts) so their CPU is not counted as the engine's.
 *   1. Do watchers slow a run? Rounds of runs of a gate stage then S no-op stages (R rounds after a warm-up), each
 *      round one run watched by 0 and one by N server-sent event streams per watcher priority (--watcher-priorities,
 *      default 19,0: the watchers' process niced, then at the engine's own priority), all connected before the gate
 *      opens. Per variant: the run's stages/s from the gate stage's finish to the run's end (database clock) and its
 *      ratio to the unwatched run of the same round; the engine (worker) process's CPU per run (gate release to the
 *      last watcher's end) and, split, the API process's (/proc), and the server's difference per event per watcher
 *      (us); the watchers' own CPU; the database reads and notifications; and whether every watcher got every event
 *      of the run once, in stream order.
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
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { createDb, dropDb, emit, log, percentile, pgbenchTps, round } from './lib.js';

const { values: argv } = parseArgs({
  options: {
    watchers: { type: 'string', default: '50' },
    /**
     * Part 1: the nice values of the watchers' process, one variant each (the first is the headline,
     * `<N>_watchers`; the others `<N>_watchers_nice<k>`). Default 19,0: niced, and the same priority
     * as the engine (the watchers then take CPU the engine would have had on 2 cores).
     */
    'watcher-priorities': { type: 'string', default: '19,0' },
    /** Part 1: split (default: the task API in a process of its own, bench/stream-api.ts) or one-process (see above). */
    topology: { type: 'string', default: 'split' },
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

type Topology = 'split' | 'one-process';
/** The task API the watchers connect to. */
interface Api {
  url: string;
  how: string;
  /** CPU of the API's own process, ms (all its threads, /proc); null when the API runs in this process. */
  cpuMs(): number | null;
  /** The stream's statements the API has sent so far (counted where the route sends them). */
  stats(): Promise<{ reads: number; checks: number }>;
  close(): Promise<void>;
}

/** Counts the stream's statements (named ratchet_stream_*) that go through the store's queryable. */
function countStreamStatements(ratchet: Ratchet): () => { reads: number; checks: number } {
  const statements = new Map<string, number>();
  const db = ratchet.store.db as { query: (...a: unknown[]) => Promise<unknown[]> };
  const query = db.query.bind(db);
  db.query = (...a: unknown[]) => {
    const name = a[2];
    if (typeof name === 'string' && name.startsWith('ratchet_stream')) statements.set(name, (statements.get(name) ?? 0) + 1);
    return query(...a);
  };
  return () => ({ reads: statements.get('ratchet_stream_events') ?? 0, checks: statements.get('ratchet_stream_end_check') ?? 0 });
}

async function inProcessApi(ratchet: Ratchet): Promise<Api> {
  const counts = countStreamStatements(ratchet);
  const server = await createServer({ ratchet, tokens: [TOKEN], port: 0 });
  return {
    url: server.url,
    how: 'the engine, its worker and the task API in one process',
    cpuMs: () => null,
    stats: async () => counts(),
    close: () => server.close(),
  };
}

/**
 * From /proc/<pid>/task/<tid>/schedstat, summed over a process's threads, ms: field 0 is the time on a CPU,
 * field 1 the time runnable but waiting for a core (the run queue); 0 where /proc is missing.
 */
function schedstatMs(pid: number | 'self', field: 0 | 1): number {
  try {
    let ns = 0;
    for (const tid of readdirSync(`/proc/${pid}/task`))
      ns += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[field]);
    return ns / 1e6;
  } catch {
    return 0;
  }
}
const procCpuMs = (pid: number) => schedstatMs(pid, 0);

/** The task API in a process of its own (bench/stream-api.ts), on the same database; not niced, not pinned. */
async function separateApi(dbUrl: string): Promise<Api> {
  const script = fileURLToPath(new URL('./stream-api.ts', import.meta.url));
  const child = spawn(process.execPath, ['--import', 'tsx', script, dbUrl, TOKEN], { stdio: ['pipe', 'pipe', 'inherit'] });
  const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
  const lines = createInterface({ input: child.stdout });
  const waiting: ((words: string[]) => void)[] = [];
  const next = (kind: string) =>
    new Promise<string[]>((resolve, reject) => {
      waiting.push((words) => (words[0] === kind ? resolve(words) : reject(new Error(`stream-api.ts: ${words.join(' ')}`))));
    });
  lines.on('line', (l) => waiting.shift()?.(l.split(' ')));
  const listening = next('listening');
  const [, url] = await Promise.race([
    listening,
    exited.then(() => {
      throw new Error('stream-api.ts exited before listening');
    }),
  ]);
  return {
    url: url!,
    how: `the task API in its own process (pid ${child.pid}, not niced, not pinned), the engine and its worker in the bench's`,
    cpuMs: () => procCpuMs(child.pid!),
    async stats() {
      const answer = next('stats');
      child.stdin.write('stats\n');
      const [, reads, checks] = await answer;
      return { reads: Number(reads), checks: Number(checks) };
    },
    async close() {
      child.stdin.end();
      const timer = setTimeout(() => child.kill(), 10_000);
      await exited;
      clearTimeout(timer);
    },
  };
}

async function withEngine<T>(name: string, topology: Topology, fn: (r: Ratchet, api: Api, dbUrl: string) => Promise<T>): Promise<T> {
  const dbUrl = await createDb(cfg.adminUrl, name);
  const ratchet = await createRatchet({ databaseUrl: dbUrl, workflows: [watched, ten], logger: silentLogger(), poolSize: 12 });
  let api: Api | undefined;
  try {
    api = topology === 'split' ? await separateApi(dbUrl) : await inProcessApi(ratchet);
    return await fn(ratchet, api, dbUrl);
  } finally {
    await api?.close();
    await ratchet.close();
    await dropDb(cfg.adminUrl, name);
  }
}

const until = async (what: string, fn: () => Promise<boolean>, ms = 120_000, everyMs = 5) => {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
};

/**
 * A watchers' process (bench/stream-watchers.ts). On this 2-core machine it would compete with the
 * engine and PostgreSQL for the cores, which in production it does not (watchers are browsers and
 * services elsewhere), so it runs under `nice -n <nice>`: the engine's and PostgreSQL's runnable
 * threads go first and the engine's figures are what the server pays. With more than 2 cores it is
 * also pinned (taskset) to the last core, so it takes at most that one.
 */
function startWatchers(nice: number) {
  const script = [process.execPath, '--import', 'tsx', fileURLToPath(new URL('./stream-watchers.ts', import.meta.url))];
  const pin = cpus().length > 2 ? ['taskset', '-c', String(cpus().length - 1)] : [];
  const argv = [...pin, ...(nice !== 0 ? ['nice', '-n', String(nice)] : []), ...script];
  // taskset and nice exec the next program: the pid stays the watchers' (for /proc below).
  const child = spawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'pipe', 'inherit'] });
  const how = `${pin.length > 0 ? `pinned to core ${cpus().length - 1} (taskset), ` : 'not pinned (2 cores or fewer), '}nice ${nice}`;
  const lines = createInterface({ input: child.stdout });
  const waiting = new Map<string, (words: string[]) => void>();
  lines.on('line', (l) => {
    const words = l.split(' ');
    if (words[0] === 'error') log(`watchers: ${l}`);
    waiting.get(`${words[0]} ${words[1]}`)?.(words);
  });
  const expect = (kind: string, runId: string) => new Promise<string[]>((resolve) => waiting.set(`${kind} ${runId}`, resolve));
  return {
    how,
    /** utime + stime of the watchers' process from /proc (clock ticks of 10 ms); 0 where /proc is missing. */
    cpuMs(): number {
      try {
        const f = readFileSync(`/proc/${child.pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
        return (Number(f[11]) + Number(f[12])) * 10;
      } catch {
        return 0;
      }
    },
    /** Opens n streams of the run; `open` settles when each has its first event, `done` when all have ended. */
    watch(url: string, runId: string, n: number) {
      const open = expect('open', runId);
      const done = expect('done', runId).then(([, , lo, hi, same, ids]) => ({
        fewest: Number(lo),
        most: Number(hi),
        same: same === '1',
        ids: ids ?? '',
      }));
      child.stdin.write(`watch ${url} ${TOKEN} ${runId} ${n}\n`);
      return { open, done };
    },
    kill: () => child.kill(),
  };
}
type Watchers = ReturnType<typeof startWatchers>;

interface Variant {
  /** 0_watchers, N_watchers (the watchers niced: the headline) and N_watchers_nice<k> for the other priorities. */
  name: string;
  watchers: number;
  process: Watchers | null;
}
interface Sample {
  ms: number;
  stagesPerS: number;
  /** The engine process's CPU from the gate's release to the last watcher's end (or the run's end, unwatched). */
  engineCpuMs: number;
  engineSysMs: number;
  /** The engine process's time runnable but waiting for a core (run queue, /proc schedstat), same span: the machine's contention. */
  engineRunqMs: number;
  /** The API process's, same span (split); null when the API is the engine's process. */
  apiCpuMs: number | null;
  watcherCpuMs: number;
  events: number;
  /** Every watcher got every event of the run once, in stream order (true when unwatched). */
  everyEvent: boolean;
  fewest: number | null;
  streamReads: number;
  endChecks: number;
  notifications: number;
  /** Reads of the events table in the whole run, watchers' opening included (pg_stat_user_tables). */
  eventReads: number;
}

async function watchersBench(): Promise<void> {
  const priorities = argv['watcher-priorities']
    .split(',')
    .filter(Boolean)
    .map((v) => Number(v));
  if (priorities.length === 0 || priorities.some((v) => !Number.isInteger(v) || v < 0 || v > 19))
    throw new Error('--watcher-priorities: nice values 0..19, comma-separated (the first is the headline)');
  const topology = argv.topology;
  if (topology !== 'split' && topology !== 'one-process') throw new Error('--topology: split or one-process');
  const variants: Variant[] = [{ name: '0_watchers', watchers: 0, process: null }];
  for (const [k, nice] of priorities.entries())
    variants.push({
      name: k === 0 ? `${cfg.watchers}_watchers` : `${cfg.watchers}_watchers_nice${nice}`,
      watchers: cfg.watchers,
      process: startWatchers(nice),
    });
  for (const v of variants) if (v.process) log(`${v.name}: the watchers' process ${v.process.how}`);
  try {
    await withEngine('bench_stream_watchers', topology, async (ratchet, api, dbUrl) => {
      log(`topology ${topology}: ${api.how}`);
      const url = api.url;
      await ratchet.worker({ pollIntervalMs: 50, concurrency: 4 }).start();
      // Reads of the events table (index + sequential scans, pg_stat_user_tables): what the streams ask the database.
      const eventReads = async () => {
        await new Promise((r) => setTimeout(r, 1200)); // the backends' statistics reach the shared counters within a second
        const [r] = await ratchet.store.db.query(
          `SELECT (coalesce(idx_scan, 0) + coalesce(seq_scan, 0))::bigint AS n FROM pg_stat_user_tables WHERE schemaname = 'ratchet' AND relname = 'events'`,
        );
        return Number(r?.n ?? 0);
      };
      // The stream's own statements are counted where the API sends them (api.stats); the notifications of the
      // watched run by a LISTEN of our own.
      const pg = (await import('pg')).default;
      const listen = new pg.Client({ connectionString: dbUrl });
      const notes = new Map<string, number>();
      listen.on('notification', (m) => notes.set(m.payload ?? '', (notes.get(m.payload ?? '') ?? 0) + 1));
      await listen.connect();
      await listen.query('LISTEN ratchet_events');

      let reads = await eventReads();
      const runOnce = async (v: Variant, key: string): Promise<Sample> => {
        const { id } = await ratchet.submit('watched', { key });
        const streams = v.process?.watch(url, id, v.watchers) ?? null;
        if (streams) await streams.open;
        await until('the gate', async () => gates.has(key));
        const stats0 = await api.stats();
        const notes0 = notes.get(id) ?? 0;
        const watcherCpu0 = v.process?.cpuMs() ?? 0;
        const apiCpu0 = api.cpuMs();
        const runq0 = schedstatMs('self', 1);
        const cpu0 = process.cpuUsage();
        gates.get(key)!();
        // Polled every 20 ms, in every variant alike; the run's time itself comes from the database.
        await until(
          'the run to end',
          async () => (await ratchet.store.db.query(`SELECT 1 FROM ratchet.runs WHERE id = $1 AND state = 'succeeded'`, [id])).length > 0,
          120_000,
          20,
        );
        // From the gate stage's finish to the run's end (database clock): the 30 no-op stages.
        const [{ ms }] = (await ratchet.store.db.query(
          `SELECT extract(epoch FROM r.finished_at - s.finished_at)::float8 * 1000 AS ms
           FROM ratchet.runs r JOIN ratchet.stages s ON s.run_id = r.id AND s.tool = 'gate' WHERE r.id = $1`,
          [id],
        )) as [{ ms: number }];
        const got = streams ? await streams.done : null;
        const cpu = process.cpuUsage(cpu0);
        const runq = schedstatMs('self', 1) - runq0;
        const apiCpu1 = api.cpuMs();
        const stats = await api.stats();
        const [{ n: events, ids }] = (await ratchet.store.db.query(
          `SELECT count(*)::int AS n, string_agg(id::text, ',' ORDER BY coalesce(tx, '0'::xid8), id) AS ids FROM ratchet.events WHERE run_id = $1`,
          [id],
        )) as [{ n: number; ids: string }];
        const everyEvent = got === null || (got.same && got.fewest === events && got.most === events && got.ids === ids);
        if (!everyEvent)
          log(`${v.name}: the watchers of ${id} got ${got?.fewest}..${got?.most} of ${events} events (same order: ${got?.same})`);
        const sample: Sample = {
          ms,
          stagesPerS: (cfg.stages * 1000) / ms,
          engineCpuMs: (cpu.user + cpu.system) / 1000,
          engineSysMs: cpu.system / 1000,
          engineRunqMs: runq,
          apiCpuMs: apiCpu0 === null || apiCpu1 === null ? null : apiCpu1 - apiCpu0,
          watcherCpuMs: (v.process?.cpuMs() ?? 0) - watcherCpu0,
          events,
          everyEvent,
          fewest: got?.fewest ?? null,
          streamReads: stats.reads - stats0.reads,
          endChecks: stats.checks - stats0.checks,
          notifications: (notes.get(id) ?? 0) - notes0,
          eventReads: 0,
        };
        const now = await eventReads(); // also lets the watchers' process finish before the next run
        sample.eventReads = now - reads;
        reads = now;
        return sample;
      };

      // Rounds of one run per variant (order rotated each round), so a change in the machine's load
      // falls on every variant alike; round 0 warms up and is not counted.
      const samples = new Map<string, Sample[]>(variants.map((v) => [v.name, []]));
      for (let i = 0; i <= cfg.runs; i++) {
        const parts: string[] = [];
        for (let j = 0; j < variants.length; j++) {
          const v = variants[(i + j) % variants.length]!;
          const s = await runOnce(v, `${v.name}-${i}`);
          if (i > 0) samples.get(v.name)!.push(s);
          parts.push(
            `${v.name} ${round(s.stagesPerS, 1)} stages/s, engine ${round(s.engineCpuMs)} ms CPU (sys ${round(s.engineSysMs)}, waited for a core ${round(s.engineRunqMs)})` +
              (s.apiCpuMs === null ? '' : `, API ${round(s.apiCpuMs)} ms`),
          );
        }
        log(`round ${i}${i === 0 ? ' (warm-up)' : ''}: ${parts.join('; ')}`);
      }
      await listen.end();

      const med = (xs: number[]) => percentile(xs, 50)!;
      const base = samples.get('0_watchers')!;
      const summary: string[] = [];
      for (const v of variants) {
        const ss = samples.get(v.name)!;
        const stagesPerS = ss.map((s) => s.stagesPerS);
        const cpu = ss.map((s) => s.engineCpuMs);
        const apiCpu = ss.map((s) => s.apiCpuMs ?? 0);
        emit('stream', {
          metric: 'stage_ms_p50',
          variant: v.name,
          value: round(
            percentile(
              ss.map((s) => s.ms / cfg.stages),
              50,
            )!,
          ),
          unit: 'ms',
          info: { runs: cfg.runs, stages: cfg.stages, perStage: ss.map((s) => round(s.ms / cfg.stages)) },
        });
        emit('stream', {
          metric: 'run_stages_per_s',
          variant: v.name,
          value: round(med(stagesPerS)),
          unit: 'stages/s',
          info: {
            runs: cfg.runs,
            stages: cfg.stages,
            watchers: v.process?.how ?? 'none',
            topology,
            perRun: stagesPerS.map((x) => round(x)),
            // CPU of this process per run, ms: the engine and its worker (one-process: the API and its streams too).
            engineCpuMsPerRun: cpu.map((x) => round(x)),
            engineCpuMsMedian: round(med(cpu)),
            // The engine process's time runnable but waiting for a core per run, ms (the 2 cores' contention).
            engineRunqMsPerRun: ss.map((s) => round(s.engineRunqMs)),
            // split: CPU of the API's process per run, ms (the streams' reads and socket writes).
            ...(topology === 'split' ? { apiCpuMsPerRun: apiCpu.map((x) => round(x)), apiCpuMsMedian: round(med(apiCpu)) } : {}),
            eventsPerRun: med(ss.map((s) => s.events)),
            everyWatcherGotEveryEventInOrder: ss.every((s) => s.everyEvent),
            eventReadsPerRun: ss.map((s) => s.eventReads),
            // From the gate's release to the last watcher's end: the streams' reads and end checks, and the run's notifications.
            streamReadsPerRun: ss.map((s) => s.streamReads),
            streamEndChecksPerRun: ss.map((s) => s.endChecks),
            notificationsPerRun: ss.map((s) => s.notifications),
            // CPU of the watchers' own process per run, ms (the clients: elsewhere in production).
            watcherProcessCpuMsPerRun: ss.map((s) => round(s.watcherCpuMs)),
            loadavg1: round(loadavg()[0]!, 2),
          },
        });
        const apiPart = (xs: number[]) => (topology === 'split' ? `, API process CPU ${round(med(xs))} ms/run` : '');
        if (v.watchers === 0) {
          summary.push(
            `  ${v.name}: ${round(med(stagesPerS), 1)} stages/s, engine${topology === 'split' ? ' (worker)' : ''} CPU ${round(med(cpu))} ms/run${apiPart(apiCpu)}, ` +
              `engine waited for a core ${round(med(ss.map((s) => s.engineRunqMs)))} ms/run (median)`,
          );
          continue;
        }
        // Round by round against the unwatched run of the same round, then the median of those.
        const ratios = ss.map((s, k) => s.stagesPerS / base[k]!.stagesPerS);
        const added = ss.map((s, k) => s.engineCpuMs - base[k]!.engineCpuMs);
        const deliveries = med(ss.map((s) => s.events)) * v.watchers;
        const usPerEventPerWatcher = (med(cpu) - med(base.map((s) => s.engineCpuMs))) * (1000 / deliveries);
        const baseApi = base.map((s) => s.apiCpuMs ?? 0);
        const apiUsPerEventPerWatcher = (med(apiCpu) - med(baseApi)) * (1000 / deliveries);
        // The server's cost per delivery: the API process's (split), or the one process's (one-process).
        const serverUs = topology === 'split' ? apiUsPerEventPerWatcher : usPerEventPerWatcher;
        emit('stream', {
          metric: 'watched_over_unwatched',
          variant: v.name,
          value: round(med(ratios), 3),
          unit: 'x',
          info: { perRound: ratios.map((x) => round(x, 3)), ofMedians: round(med(stagesPerS) / med(base.map((s) => s.stagesPerS)), 3) },
        });
        emit('stream', {
          metric: 'engine_cpu_us_per_event_per_watcher',
          variant: v.name,
          value: round(usPerEventPerWatcher, 1),
          unit: 'us',
          info: {
            engineCpuMsMedian: { unwatched: round(med(base.map((s) => s.engineCpuMs))), watched: round(med(cpu)) },
            addedMsPerRound: added.map((x) => round(x)),
            eventsPerRun: deliveries / v.watchers,
            watchers: v.watchers,
            topology,
          },
        });
        if (topology === 'split')
          emit('stream', {
            metric: 'api_cpu_us_per_event_per_watcher',
            variant: v.name,
            value: round(apiUsPerEventPerWatcher, 1),
            unit: 'us',
            info: {
              apiCpuMsMedian: { unwatched: round(med(baseApi)), watched: round(med(apiCpu)) },
              addedMsPerRound: ss.map((s, k) => round((s.apiCpuMs ?? 0) - (base[k]!.apiCpuMs ?? 0))),
              eventsPerRun: deliveries / v.watchers,
              watchers: v.watchers,
            },
          });
        summary.push(
          `  ${v.name} (${v.process!.how}): ${round(med(stagesPerS), 1)} stages/s = ${round(med(ratios), 3)}x the unwatched run of the same round ` +
            `(median; per round ${ratios.map((x) => round(x, 2)).join(' ')}); engine${topology === 'split' ? ' (worker)' : ''} CPU ${round(med(cpu))} ms/run` +
            `${apiPart(apiCpu)}, engine waited for a core ${round(med(ss.map((s) => s.engineRunqMs)))} ms/run; the server +${round(serverUs, 1)} us per event per watcher` +
            `${topology === 'split' ? ` (API process; the worker's ${round(usPerEventPerWatcher, 1)})` : ''}; watchers' own process ${round(med(ss.map((s) => s.watcherCpuMs)))} ms/run; ` +
            `every watcher got all ${deliveries / v.watchers} events once, in order: ${ss.every((s) => s.everyEvent) ? 'yes' : 'NO'}; ` +
            `stream reads ${med(ss.map((s) => s.streamReads))} for ${med(ss.map((s) => s.notifications))} notifications per run`,
        );
      }
      log(
        `stream watchers, topology ${topology}, ${cfg.runs} rounds of ${cfg.stages} stages (load average ${loadavg()
          .map((x) => round(x, 2))
          .join(' ')}):\n${summary.join('\n')}`,
      );
    });
  } finally {
    for (const v of variants) v.process?.kill();
  }
}

async function throughputOnce(trigger: boolean, round_: number): Promise<void> {
  await withEngine(`bench_stream_notify_${trigger ? 'on' : 'off'}`, 'one-process', async (ratchet) => {
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
