import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStore, type Store } from '../../src/store/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { insertQueuedStages } from '../helpers/stages.js';

/**
 * The sweeper re-sends a queued stage only once it has waited one sweep interval (its wake-up
 * was sent when it was queued); an expired lease is re-sent at once. Nothing due is ever left
 * out for good: after the grace every queued stage comes back.
 */
let tdb: TestDatabase;
let store: Store;
beforeAll(async () => {
  tdb = await createTestDatabase('sweep_grace');
  store = await openStore({ databaseUrl: tdb.url, poolSize: 2 });
});
afterAll(async () => {
  await store?.close();
  await tdb?.drop();
});

describe('sweep grace', () => {
  it('skips queued stages younger than the grace, never expired leases, and returns every queued stage after it', async () => {
    await insertQueuedStages(store.db, 5, 'sg');
    const lanes = [{ toolClass: 'sg', definitionHash: 'h' }];
    expect(await store.sweep(lanes, 100, 0)).toHaveLength(5);
    expect(await store.sweep(lanes, 100)).toHaveLength(5); // default: no grace
    expect(await store.sweep(lanes, 100, 60_000)).toHaveLength(0);

    const [c] = await store.claim({ owner: 'o', toolClass: 'sg', limit: 1, definitions: ['h'] });
    await tdb.query(`UPDATE ratchet.stages SET lease_until = ratchet.db_now() - interval '1 second' WHERE id = $1`, [c!.id]);
    const expired = await store.sweep(lanes, 100, 60_000);
    expect(expired.map((s) => s.stageId)).toEqual([c!.id]);

    await store.clock.advance(61_000);
    const all = await store.sweep(lanes, 100, 60_000);
    expect(all).toHaveLength(5); // four queued past the grace + the expired lease
    expect(new Set(all.map((s) => s.stageId)).size).toBe(5);
  });
});

describe('sweep of a lane being served', () => {
  it('re-sends no queued stage of a lane with a claim in the grace; does once that claim is older', async () => {
    await insertQueuedStages(store.db, 3, 'served');
    const lanes = [{ toolClass: 'served', definitionHash: 'h' }];
    await store.clock.advance(61_000); // the queued stages are past the grace
    expect(await store.sweep(lanes, 100, 60_000)).toHaveLength(3);
    await store.claim({ owner: 'o2', toolClass: 'served', limit: 1, definitions: ['h'] }); // claimed now, lease 30 s
    expect(await store.sweep(lanes, 100, 60_000)).toHaveLength(0); // served: its workers drain it
    expect(await store.sweep(lanes, 100, 0)).toHaveLength(2); // no grace: as before
    await store.clock.advance(61_000); // the claim is old now, and its lease expired
    expect(await store.sweep(lanes, 100, 60_000)).toHaveLength(3); // two queued + the expired lease
  });
});

describe('next lease expiry', () => {
  it('is null with nothing running, the lease left by the database clock, then 0 once expired', async () => {
    const lanes = [{ toolClass: 'nle', definitionHash: 'h' }];
    expect(await store.nextLeaseExpiryMs(lanes)).toBeNull();
    await insertQueuedStages(store.db, 2, 'nle');
    expect(await store.nextLeaseExpiryMs(lanes)).toBeNull();
    await store.claim({ owner: 'o3', toolClass: 'nle', limit: 1, definitions: ['h'] }); // lease 30 s
    const left = await store.nextLeaseExpiryMs(lanes);
    expect(left).toBeGreaterThan(0);
    expect(left).toBeLessThanOrEqual(30_000);
    await store.clock.advance(31_000);
    expect(await store.nextLeaseExpiryMs(lanes)).toBe(0);
    expect(await store.nextLeaseExpiryMs([])).toBeNull();
  });
});
