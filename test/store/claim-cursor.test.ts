import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { keyCursorOf } from '../../src/store/claim.js';
import { openStore, type Store } from '../../src/store/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { insertQueuedStages } from '../helpers/stages.js';

/**
 * Issue 9, item 3 (review finding 8): the keyed claim's cursor over concurrency keys moves only
 * when the claim's transaction commits; a claim that rolls back leaves it where it was, so the
 * keys it walked keep their turn.
 */
describe('the key cursor (PostgreSQL)', () => {
  let db: TestDatabase;
  let store: Store;
  beforeAll(async () => {
    db = await createTestDatabase('claim_cursor');
    store = await openStore({ databaseUrl: db.url });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });

  it('a keyed claim that rolls back does not move the cursor; one that commits does', async () => {
    for (const k of ['a', 'b', 'c']) await insertQueuedStages(store.db, 2, 'cursor_cls', { concurrencyKey: `k-${k}`, concurrencyLimit: 1 });
    await db.query(`CREATE FUNCTION public.claim_fault() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN RAISE EXCEPTION 'injected claim failure' USING ERRCODE = 'XX000'; END $$`);
    await db.query(`CREATE TRIGGER claim_fault BEFORE UPDATE ON ratchet.stages FOR EACH ROW
      WHEN (OLD.tool_class = 'cursor_cls' AND NEW.state = 'running') EXECUTE FUNCTION public.claim_fault()`);
    const keyed = { keyed: true } as const;
    try {
      await expect(store.claim({ owner: 'A', toolClass: 'cursor_cls', limit: 1, definitions: ['h'], limits: keyed })).rejects.toThrow(
        /injected/,
      );
      expect(keyCursorOf(store.db, 'cursor_cls')).toBeUndefined();
    } finally {
      await db.query(`DROP TRIGGER claim_fault ON ratchet.stages`);
    }
    const got = await store.claim({ owner: 'A', toolClass: 'cursor_cls', limit: 1, definitions: ['h'], limits: keyed });
    expect(got).toHaveLength(1);
    expect(keyCursorOf(store.db, 'cursor_cls')).toBe('k-a');
  });
});
