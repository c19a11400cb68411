/**
 * Claim benchmark for what a claim must skip (not a test):
 * `npx tsx bench/claim.ts [--quick] [--only versions|keys] [--pg-url URL]`.
 * stdout: one JSON line per figure, {"bench":"claim","metric","variant","value","unit"[,"info"]};
 * stderr: progress and EXPLAIN (ANALYZE, BUFFERS) plans.
 *   1. versions: 1M due stages of definition v1 ahead of 10k of v2; claim latency (limit 1, each
 *      finished) for a worker that has loaded only v2, and for one with both, and their plans.
 *   2. keys: 1M due stages of a saturated key (limit 2, both slots live) ahead of 1,000 keys
 *      with 10 stages each; keyed claim latency (limit 10, each finished) and the pick's plan.
 * Each scenario makes its own database bench_claim_* and drops it afterwards.
 */
import { hostname } from 'node:os';
import { parseArgs } from 'node:util';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { openStore, type ClaimedStage, type FinishRow, type Store } from '../src/store/index.js';
import { claimSql, pickCandidatesSql } from '../src/store/claim.sql.js';
import { createDb, dropDb, emit, log, percentile, round, type Line } from './lib.js';

const { values: argv } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    only: { type: 'string' },
    'pg-url': { type: 'string', default: process.env.RATCHET_BENCH_PG_URL ?? 'postgres://root@127.0.0.1:5432/test' },
  },
});
const BACKLOG = argv.quick ? 100_000 : 1_000_000;
const CLAIMS = argv.quick ? 300 : 1000;
const CLS = 'bench';
const out = (line: Line) => emit('claim', line);
const owner = `bench@${hostname()}:${process.pid}`;
const done = (c: ClaimedStage): FinishRow => ({
  stageId: c.id,
  fence: c.fence,
  outcome: 'succeeded',
  result: {},
  run: { state: 'succeeded', result: {} },
});

/**
 * `count` single-stage runs of definition `hash`, due `agoMs` ago plus their index in ms (so
 * they stay in insertion order), under concurrency key `key(i)` with `limit` when given.
 */
async function insert(
  store: Store,
  count: number,
  hash: string,
  agoMs: number,
  key: string | null = null,
  keys = 1,
  limit: number | null = null,
): Promise<void> {
  await store.db.query(
    `
    WITH r AS (
      INSERT INTO ratchet.runs (id, workflow, definition_hash, input, state)
      SELECT gen_random_uuid(), 'bench', $2, jsonb_build_object('i', i), 'queued' FROM generate_series(1, $1::int) AS i
      RETURNING id, (input->>'i')::int AS i
    )
    INSERT INTO ratchet.stages (run_id, definition_hash, seq, name, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms,
      max_attempts, idempotency_key, input, available_at, concurrency_key, concurrency_limit)
    SELECT r.id, $2, 1, 'noop', 'noop', $3, 'queued', 30000, 30000, 600000, 3, r.id::text || ':1:noop', '{}'::jsonb,
      ratchet.db_now() - $4::int * interval '1 millisecond' + r.i * interval '1 microsecond',
      CASE WHEN $5::text IS NULL THEN NULL WHEN $6::int = 1 THEN $5 ELSE $5 || (r.i % $6::int) END, $7
    FROM r`,
    [count, hash, CLS, agoMs, key, keys, limit],
  );
}

async function withStore(
  name: string,
  setup: (store: Store) => Promise<void>,
  fn: (store: Store, url: string) => Promise<void>,
): Promise<void> {
  const url = await createDb(argv['pg-url'], name);
  const store = await openStore({ databaseUrl: url, poolSize: 2, applicationName: 'ratchet-bench', queryTimeoutMs: 600_000 });
  try {
    const t0 = performance.now();
    await setup(store);
    await store.db.query('VACUUM ANALYZE');
    await store.db.query('CHECKPOINT');
    log(`${name}: set up in ${round((performance.now() - t0) / 1000, 1)} s`);
    await fn(store, url);
  } finally {
    await store.close();
    await dropDb(argv['pg-url'], name);
  }
}

/** EXPLAIN (ANALYZE, BUFFERS) of one prepared statement, rolled back; returns its execution time. */
async function explain(url: string, label: string, sql: string, types: string, args: string): Promise<void> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    await c.query(`PREPARE q(${types}) AS ${sql}`);
    for (const mode of ['custom', 'generic'] as const) {
      await c.query(`SET plan_cache_mode = force_${mode}_plan`);
      await c.query('BEGIN');
      const [
        {
          'QUERY PLAN': [plan],
        },
      ] = (await c.query(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE q(${args})`)).rows;
      await c.query('ROLLBACK');
      await c.query('BEGIN');
      const text = (await c.query(`EXPLAIN (ANALYZE, BUFFERS) EXECUTE q(${args})`)).rows.map((r) => r['QUERY PLAN'] as string).join('\n');
      await c.query('ROLLBACK');
      process.stderr.write(`\n---- EXPLAIN ${label}, ${mode} plan ----\n${text}\n\n`);
      out({
        metric: 'explain_execution',
        variant: `${label},${mode}`,
        value: round(plan['Execution Time'], 3),
        unit: 'ms',
        info: {
          planning_ms: plan['Planning Time'],
          shared_hit: plan.Plan['Shared Hit Blocks'],
          shared_read: plan.Plan['Shared Read Blocks'],
        },
      });
    }
  } finally {
    await c.end();
  }
}

/** Latency of `claims` claims (each finished at once); the rows each claim returned, summed. */
async function latency(label: string, store: Store, claim: () => Promise<ClaimedStage[]>): Promise<void> {
  const ms: number[] = [];
  let rows = 0;
  for (let i = 0; i < 20 + CLAIMS; i++) {
    const t0 = performance.now();
    const got = await claim();
    if (i >= 20) ms.push(performance.now() - t0);
    rows += got.length;
    if (got.length > 0) await store.finish(owner, got.map(done));
  }
  for (const p of [50, 99]) {
    out({
      metric: `claim_latency_p${p}`,
      variant: label,
      value: round(percentile(ms, p)!, 3),
      unit: 'ms',
      info: { claims: ms.length, rows },
    });
  }
  log(
    `${label}: claim p50 ${round(percentile(ms, 50)!, 3)} ms, p99 ${round(percentile(ms, 99)!, 3)} ms, ${rows} rows claimed in ${20 + CLAIMS} claims`,
  );
}

if (argv.only === undefined || argv.only === 'versions')
  await withStore(
    'bench_claim_versions',
    async (store) => {
      await insert(store, BACKLOG, 'v1', 3_600_000);
      await insert(store, 10_000, 'v2', 1_000);
    },
    async (store, url) => {
      await explain(
        url,
        `versions,${BACKLOG}_of_v1_ahead,claimer_has_v2`,
        claimSql(1, 1),
        'text, text, text[]',
        `'o', '${CLS}', ARRAY['v2']`,
      );
      await explain(
        url,
        `versions,${BACKLOG}_of_v1_ahead,claimer_has_v1_v2`,
        claimSql(1, 2),
        'text, text, text[]',
        `'o', '${CLS}', ARRAY['v2', 'v1']`,
      );
      await latency(`versions,${BACKLOG}_of_v1_ahead,claimer_has_v2`, store, () =>
        store.claim({ owner, toolClass: CLS, limit: 1, definitions: ['v2'] }),
      );
      await latency(`versions,${BACKLOG}_of_v1_ahead,claimer_has_v1_v2`, store, () =>
        store.claim({ owner, toolClass: CLS, limit: 1, definitions: ['v2', 'v1'] }),
      );
    },
  );

if (argv.only === undefined || argv.only === 'keys')
  await withStore(
    'bench_claim_keys',
    async (store) => {
      await insert(store, BACKLOG, 'h', 3_600_000, 'tenant-a', 1, 2);
      await store.db.query(`UPDATE ratchet.stages SET state = 'running', owner_id = 'x', fence = nextval('ratchet.fence_seq'), attempt = 1,
    lease_until = ratchet.db_now() + interval '1 day' WHERE id IN (SELECT id FROM ratchet.stages ORDER BY id LIMIT 2)`);
      await insert(store, 10_000, 'h', 1_000, 'tenant-', 1000, 2);
    },
    async (store, url) => {
      await explain(
        url,
        `keys,${BACKLOG}_of_a_saturated_key_ahead,keyed_pick_10`,
        pickCandidatesSql(10, 1, true),
        'text, text, text[], text',
        `'o', '${CLS}', ARRAY['h'], ''`,
      );
      await latency(`keys,${BACKLOG}_of_a_saturated_key_ahead,keyed_claim_10`, store, () =>
        store.claim({ owner, toolClass: CLS, limit: 10, definitions: ['h'], limits: { keyed: true } }),
      );
    },
  );
log('done');
