/**
 * The hot statements' plans (not a test): `npx tsx bench/explain.ts [--runs N] [--waiting N] [--pg-url URL]`.
 * pg_stat_statements needs shared_preload_libraries (a server restart); where it is not loaded,
 * this is the fallback: an in-process worker runs N no-op runs of 10 stages (fast path) over a
 * fresh database with `--waiting` unrelated stages queued, and the first 3 executions of every
 * named statement are also run under EXPLAIN (ANALYZE, BUFFERS) in a transaction rolled back just
 * before the real one. Prints, per statement: calls, mean ms, and the plan of the slowest EXPLAIN.
 */
import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { createRatchet } from '../src/engine.js';
import { silentLogger } from '../src/logger.js';
import { createDb, dropDb, insertQueuedStages, log, round } from './lib.js';
import { noop10 } from './workflows/noop.js';

const { values: argv } = parseArgs({
  options: {
    runs: { type: 'string', default: '100' },
    waiting: { type: 'string', default: '10000' },
    'pg-url': { type: 'string', default: process.env.RATCHET_BENCH_PG_URL ?? 'postgres://root@127.0.0.1:5432/test' },
  },
});
const runs = Number(argv.runs);
const dbName = 'bench_explain';
const url = await createDb(argv['pg-url'], dbName);
const side = new pg.Client({ connectionString: url });
await side.connect();
const r = await createRatchet({ databaseUrl: url, workflows: [noop10], logger: silentLogger(), poolSize: 4 });
try {
  await insertQueuedStages(r.store.db, Number(argv.waiting), 'other');
  await r.store.db.query('ANALYZE');
  const stats = new Map<string, { n: number; ms: number; plans: { ms: number; plan: string }[] }>();
  const db = r.store.db;
  const raw = db.query.bind(db);
  let explaining: Promise<unknown> = Promise.resolve();
  (db as { query: unknown }).query = async (text: string, params?: readonly unknown[], name?: string) => {
    const key = name ? name.replace(/_\d+$/, '') : 'unnamed';
    const s = stats.get(key) ?? { n: 0, ms: 0, plans: [] };
    stats.set(key, s);
    if (name && s.plans.length < 3 && !/^\s*(BEGIN|COMMIT|ROLLBACK)/i.test(text)) {
      // One EXPLAIN at a time on the side connection, rolled back; then the real statement.
      const run = explaining.then(async () => {
        await side.query('BEGIN');
        try {
          const t = performance.now();
          const plan = await side.query(`EXPLAIN (ANALYZE, BUFFERS) ${text}`, params as unknown[]);
          s.plans.push({ ms: performance.now() - t, plan: plan.rows.map((x) => x['QUERY PLAN']).join('\n') });
        } catch (err) {
          s.plans.push({ ms: 0, plan: `(explain failed: ${(err as Error).message})` });
        } finally {
          await side.query('ROLLBACK');
        }
      });
      explaining = run.catch(() => {});
      await run.catch(() => {});
    }
    const t = performance.now();
    const rows = await raw(text, params, name);
    s.n++;
    s.ms += performance.now() - t;
    return rows;
  };
  for (let i = 0; i < runs; i++) await r.submit('noop10', {});
  const w = r.worker({ concurrency: 10 });
  await w.start();
  for (;;) {
    const [x] = await raw(`SELECT count(*)::int AS n FROM ratchet.runs WHERE workflow = 'noop10' AND state = 'succeeded'`);
    if ((x!.n as number) >= runs) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  await w.stop({ graceMs: 2000 });
  for (const [k, s] of [...stats].sort((a, b) => b[1].ms - a[1].ms)) {
    process.stdout.write(`\n=== ${k}: ${s.n} calls, mean ${round(s.ms / Math.max(s.n, 1), 3)} ms, total ${round(s.ms, 0)} ms\n`);
    const worst = s.plans.sort((a, b) => b.ms - a.ms)[0];
    if (worst) process.stdout.write(`${worst.plan}\n`);
  }
} finally {
  await r.close();
  await side.end();
  await dropDb(argv['pg-url'], dbName);
  log('done');
}
