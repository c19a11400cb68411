import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStore, type PruneBatch, type Store } from '../../src/store/index.js';
import { DAY_MS, insertRuns } from '../helpers/finished-runs.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/** Prune batches are bounded in events as well as in runs: runs with long histories never make one long statement. */
describe('prune batches bounded in events', () => {
  let db: TestDatabase;
  let store: Store;
  beforeAll(async () => {
    db = await createTestDatabase('prune_events');
    store = await openStore({ databaseUrl: db.url });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });
  const left = async (workflow: string) =>
    (
      await db.query(
        `SELECT (SELECT count(*)::int FROM ratchet.runs WHERE workflow = $1) AS runs,
          (SELECT count(*)::int FROM ratchet.events e JOIN ratchet.runs r ON r.id = e.run_id WHERE r.workflow = $1) AS events`,
        [workflow],
      )
    )[0];

  it('runs go while their events fit the bound; the rest wait for the next batch', async () => {
    await insertRuns(store.db, { count: 10, createdAgoMs: 40 * DAY_MS, states: ['succeeded'], eventsPerRun: 30, workflow: 'many' });
    await insertRuns(store.db, { count: 3, createdAgoMs: 40 * DAY_MS, finished: false, states: ['running'], workflow: 'live' });
    const batches: PruneBatch[] = [];
    const r = await store.prune({
      olderThan: { succeeded: '30d' },
      batchSize: 100,
      batchEvents: 100,
      onBatch: (b) => void batches.push(b),
    });
    expect(batches.every((b) => b.events <= 100)).toBe(true);
    expect(batches.map((b) => b.runs)).toEqual([3, 3, 3, 1]);
    expect([r.runs, r.events]).toEqual([10, 300]);
    expect(await left('many')).toEqual({ runs: 0, events: 0 });
    expect((await left('live'))!.runs).toBe(3);
  });

  it('a single run with more events than the bound is emptied in steps, then goes', async () => {
    await insertRuns(store.db, { count: 1, createdAgoMs: 40 * DAY_MS, states: ['failed'], eventsPerRun: 250, workflow: 'huge' });
    const batches: PruneBatch[] = [];
    const r = await store.prune({ olderThan: { failed: '30d' }, batchEvents: 100, onBatch: (b) => void batches.push(b) });
    expect(batches.map((b) => [b.runs, b.events])).toEqual([
      [0, 100],
      [0, 100],
      [1, 50],
    ]);
    expect([r.runs, r.events, r.stages]).toEqual([1, 250, 1]);
    expect(await left('huge')).toEqual({ runs: 0, events: 0 });
  });
});
