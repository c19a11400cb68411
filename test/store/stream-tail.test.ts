import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStore, type Store } from '../../src/store/index.js';
import { readStreamTail } from '../../src/store/stream.js';
import { until } from '../api/helpers.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * The dashboard's two tail reads (src/store/stream.ts readStreamTail): the exact one (the page's
 * resume position: the newest final events in stream order, over the whole run) and the bounded
 * one for panel refreshes (`recentOnly`: the same from the newest 2 x limit + 100 events by id).
 */
describe('readStreamTail (PostgreSQL)', () => {
  let db: TestDatabase;
  let store: Store;
  const run = randomUUID();
  beforeAll(async () => {
    db = await createTestDatabase('stream_tail');
    store = await openStore({ databaseUrl: db.url });
    // 300 events, one transaction each (stream order = id order here), and one transaction of 5.
    for (let i = 0; i < 300; i++) await db.query(`INSERT INTO ratchet.events (run_id, type, data) VALUES ($1, 'note', $2)`, [run, { i }]);
    await db.query(
      `INSERT INTO ratchet.events (run_id, type, data) SELECT $1, 'note', jsonb_build_object('i', 300 + g) FROM generate_series(0, 4) g`,
      [run],
    );
    // An event is final once every transaction older than its own has ended, in the whole cluster (pg_snapshot_xmin):
    // another test file's open transaction (CI runs them side by side) holds the newest ones back for a while.
    await until('the 305 events to be final', async () => (await readStreamTail(store.db, run, 400)).events.length >= 305, 30_000);
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });

  it('the bounded read gives the exact read\'s events, positions and "earlier" flag', async () => {
    for (const limit of [1, 10, 100, 305, 400]) {
      const exact = await readStreamTail(store.db, run, limit);
      const recent = await readStreamTail(store.db, run, limit, { recentOnly: true });
      expect(recent).toEqual(exact);
      expect(exact.events).toHaveLength(Math.min(limit, 305));
      expect(exact.earlier).toBe(limit < 305);
      expect(exact.events.at(-1)!.data).toEqual({ i: 304 });
      const ids = exact.events.map((e) => BigInt(e.id));
      expect(ids).toEqual([...ids].sort((a, b) => (a < b ? -1 : 1)));
    }
  });

  it('an unknown or malformed run id: nothing, on both reads', async () => {
    for (const recentOnly of [false, true]) {
      expect(await readStreamTail(store.db, randomUUID(), 10, { recentOnly })).toEqual({ events: [], earlier: false });
      expect(await readStreamTail(store.db, 'nope', 10, { recentOnly })).toEqual({ events: [], earlier: false });
    }
  });
});
