/**
 * Store benchmark (not a test): `npm run bench:store -- [--quick] [--seconds S] [--skip-pgbench] [--pg-url URL]`.
 * stdout: one JSON line per figure, {"bench":"store","metric","variant","value","unit"[,"info"]};
 * stderr: progress and EXPLAIN plans.
 *   1. claim+complete pairs/s with 1, 4, 16 claimers: single (claim 1, finish 1) and batched
 *      (claim up to 10, finish them in one statement), each on a fresh database.
 *   2. claim latency p50/p99 (one claimer, limit 1) with 10k and 1M stages waiting, and the
 *      claim statement's EXPLAIN (ANALYZE, BUFFERS) at 1M waiting.
 *   3. pgbench single-row UPDATE tps at 1, 4, 16 clients (shared/peers script) and the ratios.
 * Every measurement makes its own database bench_* and drops it afterwards.
 */
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { openStore, type ClaimedStage, type FinishRow, type Store } from '../src/store/index.js';
import { claimSql } from '../src/store/claim.sql.js';
import {
  checkClaimPlan,
  cpuBusyPct,
  cpuSnap,
  createDb,
  dropDb,
  emit,
  insertQueuedStages,
  log,
  percentile,
  pgbenchTps,
  round,
  type Line,
} from './lib.js';

const { values: argv } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    seconds: { type: 'string' },
    'skip-pgbench': { type: 'boolean', default: false },
    'pg-url': { type: 'string', default: process.env.RATCHET_BENCH_PG_URL ?? 'postgres://root@127.0.0.1:5432/test' },
  },
});
const quick = argv.quick;
const cfg = {
  adminUrl: argv['pg-url'],
  seconds: argv.seconds ? Number(argv.seconds) : quick ? 3 : 10,
  claimers: [1, 4, 16],
  batch: 10,
  /** Stages pre-inserted for each throughput measurement; it stops early when they run out. */
  throughputStages: quick ? 20_000 : 100_000,
  latencyWaiting: quick ? [10_000, 100_000] : [10_000, 1_000_000],
  latencyClaims: quick ? 500 : 2000,
  pgbenchScript: fileURLToPath(new URL('../../shared/peers/sql/pgbench-update.sql', import.meta.url)),
};
if (!(cfg.seconds > 0)) throw new Error('--seconds must be a positive number');

const TOOL_CLASS = 'bench';
/** The definition hash insertQueuedStages gives every run. */
const DEFINITION = 'h';
const out = (line: Line) => emit('store', line);
const ownerId = (i: number) => `bench@${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}:${i}`;
const finishRow = (c: ClaimedStage): FinishRow => ({
  stageId: c.id,
  fence: c.fence,
  outcome: 'succeeded',
  result: {},
  run: { state: 'succeeded', result: {} },
});

/** A fresh database with `stages` queued single-stage runs, vacuumed and checkpointed; dropped after `fn`. */
async function withStore<T>(name: string, stages: number, poolSize: number, fn: (store: Store, url: string) => Promise<T>): Promise<T> {
  const url = await createDb(cfg.adminUrl, name);
  let store: Store | undefined;
  try {
    store = await openStore({
      databaseUrl: url,
      poolSize,
      applicationName: 'ratchet-bench',
      queryTimeoutMs: 600_000 /* bulk inserts of 1M rows */,
    });
    const t0 = performance.now();
    await insertQueuedStages(store.db, stages, TOOL_CLASS);
    await store.db.query('VACUUM ANALYZE');
    await store.db.query('CHECKPOINT');
    log(`${name}: ${stages} stages queued in ${round((performance.now() - t0) / 1000, 1)} s`);
    return await fn(store, url);
  } finally {
    await store?.close();
    await dropDb(cfg.adminUrl, name);
  }
}

/** Claim+finish pairs per second with `claimers` concurrent loops, each claiming up to `limit`. */
async function throughput(mode: 'single' | 'batched', claimers: number): Promise<number> {
  const limit = mode === 'single' ? 1 : cfg.batch;
  const variant = `${mode},claimers=${claimers}`;
  return withStore(`bench_store_${mode}_c${claimers}`, cfg.throughputStages, claimers + 2, async (store) => {
    let pairs = 0;
    let rejected = 0;
    let drained = false;
    const cpu = cpuSnap();
    const nodeCpu = process.cpuUsage();
    const start = performance.now();
    const end = start + cfg.seconds * 1000;
    await Promise.all(
      Array.from({ length: claimers }, async (_, i) => {
        const owner = ownerId(i);
        while (performance.now() < end) {
          const claimed = await store.claim({ owner, toolClass: TOOL_CLASS, limit, definitions: [DEFINITION] });
          if (claimed.length === 0) {
            drained = true;
            return;
          }
          for (const v of await store.finish(owner, claimed.map(finishRow))) v.accepted ? pairs++ : rejected++;
        }
      }),
    );
    const elapsed = (performance.now() - start) / 1000;
    const rate = pairs / elapsed;
    const { user, system } = process.cpuUsage(nodeCpu);
    out({
      metric: 'claim_complete_pairs',
      variant,
      value: round(rate, 1),
      unit: 'pairs/s',
      info: {
        pairs,
        rejected,
        elapsed_s: round(elapsed),
        drained,
        limit,
        stages_queued: cfg.throughputStages,
        cpu_busy_pct: cpuBusyPct(cpu),
        node_cpu_pct_of_one_core: round((user + system) / 1e4 / elapsed, 1),
      },
    });
    log(
      `${variant}: ${round(rate, 1)} pairs/s (${pairs} in ${round(elapsed)} s${drained ? ', drained' : ''}${rejected ? `, ${rejected} REJECTED` : ''})`,
    );
    return rate;
  });
}

/** EXPLAIN (ANALYZE, BUFFERS) of one claim (limit 1), custom and generic plan, rolled back. */
async function explainClaim(url: string, waiting: number, when: string): Promise<void> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    await c.query(`PREPARE bench_claim(text, text, text[]) AS ${claimSql(1, 1)}`);
    const exec = `EXECUTE bench_claim('bench-explain', '${TOOL_CLASS}', ARRAY['${DEFINITION}'])`;
    for (const mode of ['custom', 'generic'] as const) {
      await c.query(`SET plan_cache_mode = force_${mode}_plan`);
      await c.query('BEGIN');
      const text = (await c.query(`EXPLAIN (ANALYZE, BUFFERS) ${exec}`)).rows.map((r) => r['QUERY PLAN'] as string).join('\n');
      await c.query('ROLLBACK');
      await c.query('BEGIN');
      const [json] = (await c.query(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${exec}`)).rows[0]['QUERY PLAN'];
      await c.query('ROLLBACK');
      const check = checkClaimPlan(json.Plan);
      const ok =
        check.uses_queued_idx === true && check.uses_running_idx === true && !check.seq_scan_on_stages && !check.sort_over_stages_scan;
      process.stderr.write(
        `\n---- EXPLAIN claim, ${mode} plan, ${waiting} waiting, ${when} ----\n${text}\n---- ${JSON.stringify(check)}\n\n`,
      );
      out({
        metric: 'claim_plan_uses_partial_indexes',
        variant: `waiting=${waiting},${mode},${when}`,
        value: ok,
        unit: 'bool',
        info: { ...check, execution_ms: json['Execution Time'], planning_ms: json['Planning Time'] },
      });
    }
  } finally {
    await c.end();
  }
}

/** Claim latency (one claimer, limit 1) with `waiting` stages queued; each claim is finished. */
async function latency(waiting: number, explain: boolean): Promise<void> {
  await withStore(`bench_store_latency_${waiting}`, waiting, 3, async (store, url) => {
    if (explain) await explainClaim(url, waiting, 'before');
    const owner = ownerId(0);
    const claimMs: number[] = [];
    const finishMs: number[] = [];
    const warmup = 20;
    for (let i = 0; i < warmup + cfg.latencyClaims; i++) {
      const t0 = performance.now();
      const claimed = await store.claim({ owner, toolClass: TOOL_CLASS, limit: 1, definitions: [DEFINITION] });
      const t1 = performance.now();
      if (claimed.length !== 1) throw new Error(`claim ${i} returned ${claimed.length} rows`);
      const [v] = await store.finish(owner, claimed.map(finishRow));
      if (!v?.accepted) throw new Error(`finish ${i} was rejected`);
      if (i >= warmup) {
        claimMs.push(t1 - t0);
        finishMs.push(performance.now() - t1);
      }
    }
    const variant = `waiting=${waiting}`;
    const info = { claims: claimMs.length, max_ms: round(Math.max(...claimMs), 3) };
    for (const [metric, samples] of [
      ['claim_latency', claimMs],
      ['finish_latency', finishMs],
    ] as const) {
      for (const p of [50, 99])
        out({
          metric: `${metric}_p${p}`,
          variant,
          value: round(percentile(samples, p)!, 3),
          unit: 'ms',
          ...(metric === 'claim_latency' ? { info } : {}),
        });
    }
    log(
      `${variant}: claim p50 ${round(percentile(claimMs, 50)!, 3)} ms, p99 ${round(percentile(claimMs, 99)!, 3)} ms; finish p50 ${round(percentile(finishMs, 50)!, 3)} ms`,
    );
    // Again after the head has moved: the finished rows' dead entries stay in the partial index until vacuum.
    if (explain) await explainClaim(url, waiting, `after_${cfg.latencyClaims}_claims`);
  });
}

log(`bench:store ${JSON.stringify({ ...cfg, quick, skipPgbench: argv['skip-pgbench'] })}`);
const rates = new Map<string, number>();
const tps = new Map<number, number>();
// Interleaved per claimer count, so slow drift of the disk's flush rate hits all three alike.
for (const n of cfg.claimers) {
  if (!argv['skip-pgbench']) {
    const r = await pgbenchTps(cfg.adminUrl, cfg.pgbenchScript, n, cfg.seconds);
    tps.set(n, r.tps);
    out({
      metric: 'pgbench_update_tps',
      variant: `clients=${n}`,
      value: round(r.tps, 1),
      unit: 'tps',
      info: { xacts: r.xacts, latency_ms: r.latencyMs, seconds: cfg.seconds },
    });
    log(`pgbench clients=${n}: ${round(r.tps, 1)} tps`);
  }
  for (const mode of ['single', 'batched'] as const) rates.set(`${mode},${n}`, await throughput(mode, n));
}
for (const n of tps.keys()) {
  for (const mode of ['single', 'batched'] as const) {
    out({
      metric: 'pairs_per_pgbench_tps',
      variant: `${mode},claimers=${n}/clients=${n}`,
      value: round(rates.get(`${mode},${n}`)! / tps.get(n)!, 3),
      unit: 'ratio',
    });
  }
}
for (const [i, waiting] of cfg.latencyWaiting.entries()) await latency(waiting, i === cfg.latencyWaiting.length - 1);
log('done');
