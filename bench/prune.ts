/**
 * Retention benchmark (not a test): `npm run bench:prune -- [--runs N] [--stages S] [--events E] [--batch B] [--pglite-runs N] [--pg-url URL]`.
 * stdout: one JSON line per figure, {"bench":"prune","metric","variant","value","unit"[,"info"]}; stderr: progress and the
 * batch statement's EXPLAIN (ANALYZE, BUFFERS) on the full table.
 *   For each variant, N finished runs (S stages and E events each) inserted by SQL, then `store.prune` in batches of B:
 *   - postgres-idle: nothing else running;
 *   - postgres-load: a worker runs new two-stage runs (submitted every 5 ms) the whole time, on the same database;
 *   - pglite: the embedded store, in memory (fewer runs: one connection).
 *   Figures: runs/s and rows/s (runs + stages + events) deleted, batch duration p50 / p99 / max, and for the loaded
 *   variant the runs that finished while prune ran.
 * Each PostgreSQL variant makes its own database bench_prune_* and drops it afterwards.
 */
import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../src/definitions/index.js';
import { createRatchet } from '../src/engine.js';
import { silentLogger } from '../src/logger.js';
import { openStore, type Store } from '../src/store/index.js';
import { PRUNE_BATCH_SQL } from '../src/store/prune.sql.js';
import { DAY_MS, insertRuns } from '../test/helpers/finished-runs.js';
import { createDb, dropDb, emit, log, percentile, round } from './lib.js';

const { values: argv } = parseArgs({
  options: {
    runs: { type: 'string', default: '100000' },
    stages: { type: 'string', default: '3' },
    events: { type: 'string', default: '8' },
    batch: { type: 'string', default: '500' },
    'pglite-runs': { type: 'string', default: '20000' },
    'pg-url': { type: 'string', default: process.env.RATCHET_BENCH_PG_URL ?? 'postgres://root@127.0.0.1:5432/test' },
  },
});
const cfg = {
  runs: Number(argv.runs),
  stages: Number(argv.stages),
  events: Number(argv.events),
  batch: Number(argv.batch),
  pgliteRuns: Number(argv['pglite-runs']),
  adminUrl: argv['pg-url'],
};
const AGES = { succeeded: '30d', failed: '30d', cancelled: '30d', expired: '30d' } as const;

const quick = defineToolClass({ name: 'bench-quick', lease: '30s', heartbeat: '10s', timeout: '10s', maxDuration: '1m' });
const noop = defineTool({
  name: 'noop',
  description: 'nothing',
  class: quick,
  input: z.object({}),
  output: z.object({}),
  run: async () => ({}),
});
const work = defineWorkflow({ name: 'work', input: z.object({}), steps: [{ tool: noop }, { name: 'again', tool: noop }] });

async function fill(store: Store, runs: number): Promise<void> {
  const t = performance.now();
  for (let done = 0; done < runs; done += 50_000) {
    const count = Math.min(50_000, runs - done);
    await insertRuns(store.db, { count, createdAgoMs: 60 * DAY_MS + done, stagesPerRun: cfg.stages, eventsPerRun: cfg.events });
  }
  await store.db.query('ANALYZE ratchet.runs, ratchet.stages, ratchet.events'); // as autovacuum would after a bulk load
  log(`inserted ${runs} finished runs (${cfg.stages} stages, ${cfg.events} events each) in ${round((performance.now() - t) / 1000, 1)} s`);
}

async function explainBatch(store: Store): Promise<void> {
  const plan = await store.db
    .transaction(async (tx) => {
      const rows = await tx.query(`EXPLAIN (ANALYZE, BUFFERS) ${PRUNE_BATCH_SQL}`, ['succeeded', 30 * DAY_MS, cfg.batch]);
      throw Object.assign(new Error('rolled back on purpose'), { rows });
    })
    .catch((err: { rows?: Record<string, unknown>[] }) => {
      if (!err.rows) throw err;
      return err.rows;
    });
  log(`one batch, EXPLAIN (ANALYZE, BUFFERS), rolled back:\n${plan.map((r) => r['QUERY PLAN']).join('\n')}`);
}

async function measure(variant: string, store: Store, runs: number, during?: () => Promise<Record<string, unknown>>): Promise<void> {
  const batchMs: number[] = [];
  let last = performance.now();
  const t = performance.now();
  const r = await store.prune({
    olderThan: AGES,
    batchSize: cfg.batch,
    onBatch: () => {
      const now = performance.now();
      batchMs.push(now - last);
      last = now;
    },
  });
  const seconds = (performance.now() - t) / 1000;
  const extra = during ? await during() : {};
  if (r.runs !== runs) throw new Error(`${variant}: pruned ${r.runs} runs, expected ${runs}`);
  const rows = r.runs + r.stages + r.events;
  const info = {
    runs: r.runs,
    stages: r.stages,
    events: r.events,
    batches: r.batches,
    batchSize: cfg.batch,
    seconds: round(seconds, 2),
    ...extra,
  };
  log(`${variant}: ${JSON.stringify(info)}`);
  emit('prune', { metric: 'runs_per_s', variant, value: round(r.runs / seconds, 0), unit: 'runs/s', info });
  emit('prune', { metric: 'rows_per_s', variant, value: round(rows / seconds, 0), unit: 'rows/s' });
  emit('prune', { metric: 'batch_p50', variant, value: round(percentile(batchMs, 50) ?? 0, 1), unit: 'ms' });
  emit('prune', { metric: 'batch_p99', variant, value: round(percentile(batchMs, 99) ?? 0, 1), unit: 'ms' });
  emit('prune', { metric: 'batch_max', variant, value: round(Math.max(...batchMs), 1), unit: 'ms' });
}

async function postgres(variant: 'postgres-idle' | 'postgres-load'): Promise<void> {
  const name = `bench_prune_${variant.replace('-', '_')}`;
  const url = await createDb(cfg.adminUrl, name);
  try {
    // The fixture's inserts are long statements on a busy machine: a generous client-side statement limit.
    const ratchet = await createRatchet({ databaseUrl: url, workflows: [work], logger: silentLogger(), queryTimeoutMs: 300_000 });
    try {
      await fill(ratchet.store, cfg.runs);
      if (variant === 'postgres-idle') await explainBatch(ratchet.store);
      let during: (() => Promise<Record<string, unknown>>) | undefined;
      if (variant === 'postgres-load') {
        await ratchet.worker({ pollIntervalMs: 20, concurrency: 8 }).start();
        let stop = false;
        const ids: string[] = [];
        const feeder = (async () => {
          while (!stop && ids.length < 100_000) {
            ids.push((await ratchet.submit('work', {})).id);
            await new Promise((r) => setTimeout(r, 5));
          }
        })();
        const started = performance.now();
        during = async () => {
          stop = true;
          await feeder;
          const [c] = await ratchet.store.db.query(
            `SELECT count(*)::int AS n FROM ratchet.runs WHERE workflow = 'work' AND state = 'succeeded'`,
          );
          const seconds = (performance.now() - started) / 1000;
          emit('prune', {
            metric: 'concurrent_runs_per_s',
            variant,
            value: round((c!.n as number) / seconds, 1),
            unit: 'runs/s',
            info: { submitted: ids.length, succeeded: c!.n },
          });
          return { concurrentRunsSubmitted: ids.length, concurrentRunsSucceeded: c!.n };
        };
      }
      await measure(variant, ratchet.store, cfg.runs, during);
    } finally {
      await ratchet.close();
    }
  } finally {
    await dropDb(cfg.adminUrl, name);
  }
}

async function pglite(): Promise<void> {
  const store = await openStore({ dataDir: ':memory:' });
  try {
    await fill(store, cfg.pgliteRuns);
    await measure('pglite', store, cfg.pgliteRuns);
  } finally {
    await store.close();
  }
}

await postgres('postgres-idle');
await postgres('postgres-load');
if (cfg.pgliteRuns > 0) await pglite();
