import pg from 'pg';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { InvalidInputError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { openStore, type PruneBatch, type Store } from '../../src/store/index.js';
import { counts, until } from '../api/helpers.js';
import { DAY_MS, insertRuns } from '../helpers/finished-runs.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

const quick = defineToolClass({ name: 'prune-quick', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '5s', maxDuration: '30s' });
const step = defineTool({
  name: 'step',
  description: 'returns its input',
  class: quick,
  input: z.object({ n: z.number() }),
  output: z.object({ n: z.number() }),
  run: async (i) => i,
});
const work = defineWorkflow({ name: 'work', input: z.object({ n: z.number() }), steps: [{ tool: step }, { name: 'again', tool: step }] });

const ALL_FINISHED = { succeeded: '30d', failed: '30d', cancelled: '30d', expired: '30d' } as const;
const FINISHED_STATES = ['succeeded', 'failed', 'cancelled', 'expired'];

/** Everything about the runs of one workflow, their stages and their events, as one hash: "untouched" means equal. */
async function fingerprint(q: Pick<TestDatabase, 'query'>, workflow: string): Promise<{ runs: number; hash: string }> {
  const [row] = await q.query(
    `
    SELECT (SELECT count(*)::int FROM ratchet.runs WHERE workflow = $1) AS runs,
      md5(coalesce((SELECT string_agg(r::text, '|' ORDER BY r.id) FROM ratchet.runs r WHERE r.workflow = $1), '') ||
          coalesce((SELECT string_agg(s::text, '|' ORDER BY s.id) FROM ratchet.stages s JOIN ratchet.runs r ON r.id = s.run_id WHERE r.workflow = $1), '') ||
          coalesce((SELECT string_agg(e::text, '|' ORDER BY e.id) FROM ratchet.events e JOIN ratchet.runs r ON r.id = e.run_id WHERE r.workflow = $1), ''))
        AS hash`,
    [workflow],
  );
  return row as { runs: number; hash: string };
}

const orphans = async (q: Pick<TestDatabase, 'query'>) =>
  (
    await q.query(`
  SELECT (SELECT count(*)::int FROM ratchet.events e WHERE NOT EXISTS (SELECT 1 FROM ratchet.runs r WHERE r.id = e.run_id)) AS events,
    (SELECT count(*)::int FROM ratchet.stages s WHERE NOT EXISTS (SELECT 1 FROM ratchet.runs r WHERE r.id = s.run_id)) AS stages`)
  )[0];

describe('prune on PostgreSQL: 100,000 finished runs', () => {
  let db: TestDatabase;
  let r: Ratchet;
  const FIXTURE = 100_000;

  beforeAll(async () => {
    db = await createTestDatabase('prune');
    r = await createRatchet({ databaseUrl: db.url, workflows: [work], logger: silentLogger() });
    await r.worker({ pollIntervalMs: 20, concurrency: 4 }).start();
    // 100,000 runs that finished 60 days ago (each with a stage and three events), 1,000 that finished yesterday,
    // and 300 unfinished ones created 90 days ago (queued and running, of a class no worker serves).
    expect(await insertRuns(db, { count: FIXTURE, createdAgoMs: 60 * DAY_MS, workflow: 'old' })).toBe(FIXTURE);
    await insertRuns(db, { count: 1000, createdAgoMs: DAY_MS, workflow: 'recent' });
    await insertRuns(db, {
      count: 300,
      createdAgoMs: 90 * DAY_MS,
      finished: false,
      states: ['queued', 'running'],
      workflow: 'unfinished',
      toolClass: 'nobody',
    });
    // A run that runs again (a retry) while an old finished_at is still on its row: its state decides, not the date.
    await db.query(
      `UPDATE ratchet.runs SET finished_at = created_at + interval '1 minute' WHERE workflow = 'unfinished' AND state = 'running'`,
    );
    await db.query('ANALYZE ratchet.runs, ratchet.stages, ratchet.events'); // as autovacuum would after a bulk load
  }, 180_000);
  afterAll(async () => {
    await r?.close();
    await db?.drop();
  });

  it('--dry-run counts what would go and deletes nothing', async () => {
    const before = await counts(r);
    const res = await r.store.prune({ olderThan: ALL_FINISHED, dryRun: true });
    expect(res).toMatchObject({ dryRun: true, runs: FIXTURE, stages: FIXTURE, events: 3 * FIXTURE, batches: 0, complete: true });
    expect(Object.values(res.byState).map((s) => s.runs)).toEqual([25_000, 25_000, 25_000, 25_000]);
    expect(await counts(r)).toEqual(before);
  }, 60_000);

  it('prunes in bounded batches while new runs keep running; a locked run is skipped; nothing unfinished is touched', async () => {
    const unfinished = await fingerprint(db, 'unfinished');
    const recent = await fingerprint(db, 'recent');
    expect(unfinished.runs).toBe(300);

    // Another transaction holds one old failed run (as a retry or a cancel would): prune skips it rather than wait.
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    await holder.query('BEGIN');
    const [held] = (await holder.query(`SELECT id FROM ratchet.runs WHERE workflow = 'old' AND state = 'failed' LIMIT 1 FOR UPDATE`)).rows;

    // New runs keep coming while prune works, and one is driven to its end between two batches.
    const submitted: string[] = [];
    let stop = false;
    const feeder = (async () => {
      for (let n = 0; !stop && n < 2000; n++) {
        submitted.push((await r.submit('work', { n })).id);
        await new Promise((res) => setTimeout(res, 10));
      }
    })();
    const batches: PruneBatch[] = [];
    let betweenBatches: string | undefined;
    const doneBefore = async () =>
      (await r.store.db.query(`SELECT count(*)::int AS n FROM ratchet.runs WHERE workflow = 'work' AND state = 'succeeded'`))[0]!
        .n as number;
    const finishedAtStart = await doneBefore();
    let finishedDuring = 0;
    const res = await r.store.prune({
      olderThan: ALL_FINISHED,
      batchSize: 500,
      onBatch: async (b) => {
        batches.push(b);
        if (b.batch === 2) {
          const { id } = await r.submit('work', { n: -1 });
          betweenBatches = await until('a run between two batches', async () => (await r.getRun(id))?.state === 'succeeded' && id, 30_000);
        }
        if (b.batch === 100) finishedDuring = (await doneBefore()) - finishedAtStart;
      },
    });
    stop = true;
    await feeder;
    await holder.query('ROLLBACK');
    await holder.end();

    expect(res).toMatchObject({ dryRun: false, runs: FIXTURE - 1, stages: FIXTURE - 1, events: 3 * (FIXTURE - 1), complete: true });
    expect(batches.every((b) => b.runs <= 500)).toBe(true);
    expect(batches.length).toBeGreaterThanOrEqual(Math.ceil((FIXTURE - 1) / 500));
    expect(batches.reduce((a, b) => a + b.runs, 0)).toBe(FIXTURE - 1);
    expect(betweenBatches).toBeDefined();
    expect(finishedDuring).toBeGreaterThan(0); // runs finished while prune was halfway
    // Only the held run is left of the old ones; no event or stage outlived its run.
    expect((await db.query(`SELECT id FROM ratchet.runs WHERE workflow = 'old'`)).map((x) => x.id)).toEqual([held.id]);
    expect(await orphans(db)).toEqual({ events: 0, stages: 0 });
    // Unfinished runs (even one with an old finished_at) and recent finished ones: untouched, row for row.
    expect(await fingerprint(db, 'unfinished')).toEqual(unfinished);
    expect(await fingerprint(db, 'recent')).toEqual(recent);
    // Every run submitted meanwhile ends succeeded, with its history.
    const ids = [...submitted, betweenBatches!];
    expect(submitted.length).toBeGreaterThan(0);
    await until(
      'new runs finished',
      async () => {
        const [c] = await db.query(`SELECT count(*)::int AS n FROM ratchet.runs WHERE id = ANY($1::uuid[]) AND state = 'succeeded'`, [ids]);
        return c!.n === ids.length;
      },
      60_000,
    );
    const [ev] = await db.query(
      `SELECT count(DISTINCT run_id)::int AS n FROM ratchet.events WHERE run_id = ANY($1::uuid[]) AND type = 'run_submitted'`,
      [ids],
    );
    expect(ev!.n).toBe(ids.length);

    // Once released, the held run goes too.
    const again = await r.store.prune({ olderThan: ALL_FINISHED });
    expect(again.runs).toBe(1);
    expect((await fingerprint(db, 'old')).runs).toBe(0);
  }, 240_000);

  it('refuses bad options with a typed error and deletes nothing', async () => {
    const before = await counts(r);
    const bad: unknown[] = [
      { olderThan: { running: '1d' } },
      { olderThan: { succeeded: '0ms' } },
      { olderThan: { succeeded: 'soon' } },
      { olderThan: { succeeded: -5 } },
      { olderThan: { succeeded: '1d' }, batchSize: 0 },
      { olderThan: { succeeded: '1d' }, batchSize: 1_000_000 },
      {},
    ];
    for (const o of bad) {
      await expect(r.store.prune(o as never), JSON.stringify(o)).rejects.toBeInstanceOf(InvalidInputError);
    }
    expect(await counts(r)).toEqual(before);
  });
});

describe('prune on the embedded store (PGlite)', () => {
  let store: Store;
  beforeAll(async () => {
    store = await openStore({ dataDir: ':memory:' });
  });
  afterAll(async () => {
    await store?.close();
  });

  it('uses the same SQL: by state and age, in batches, with stages and events; a state not named is kept', async () => {
    await insertRuns(store.db, { count: 40, createdAgoMs: 10 * DAY_MS, workflow: 'old', stagesPerRun: 2, eventsPerRun: 2 });
    await insertRuns(store.db, { count: 8, createdAgoMs: 2 * DAY_MS, workflow: 'young' });
    await insertRuns(store.db, { count: 6, createdAgoMs: 20 * DAY_MS, finished: false, states: ['queued', 'running'], workflow: 'open' });
    const dry = await store.prune({ olderThan: { succeeded: '7d', failed: '7d' }, dryRun: true });
    expect(dry).toMatchObject({ runs: 20, stages: 40, events: 40, batches: 0 });
    const res = await store.prune({ olderThan: { succeeded: '7d', failed: '7d' }, batchSize: 3 });
    expect(res).toMatchObject({ runs: 20, stages: 40, events: 40, complete: true });
    expect(res.batches).toBe(2 * Math.ceil(10 / 3) + (10 % 3 === 0 ? 2 : 0));
    const left = await store.db.query(`SELECT workflow, state, count(*)::int AS n FROM ratchet.runs GROUP BY 1, 2 ORDER BY 1, 2`);
    expect(left).toEqual([
      { workflow: 'old', state: 'cancelled', n: 10 },
      { workflow: 'old', state: 'expired', n: 10 },
      { workflow: 'open', state: 'queued', n: 3 },
      { workflow: 'open', state: 'running', n: 3 },
      ...[...FINISHED_STATES].sort().map((state) => ({ workflow: 'young', state, n: 2 })),
    ]);
    // maxBatchesPerState bounds the work (the sweeper's tick) and says when more remains.
    const bounded = await store.prune({ olderThan: { cancelled: '7d' }, batchSize: 4, maxBatchesPerState: 1 });
    expect(bounded).toMatchObject({ runs: 4, batches: 1, complete: false });
    expect(await orphans(store.db)).toEqual({ events: 0, stages: 0 });
  });
});
