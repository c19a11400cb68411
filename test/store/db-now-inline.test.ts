import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DB_NOW_EXPR } from '../../src/store/lease-common.sql.js';
import { openStore, type Store } from '../../src/store/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * The hot statements' clock (finish, claim, extend, release) is ratchet.db_now()'s body inlined
 * (DB_NOW_EXPR, lease-common.sql.ts): it must give what the function gives, with the clock moved too.
 */
describe.each(['pglite', 'postgres'] as const)('inlined db_now on %s', (kind) => {
  let db: TestDatabase | undefined;
  let store: Store;
  beforeAll(async () => {
    if (kind === 'postgres') db = await createTestDatabase('db_now_inline');
    store = await openStore(db ? { databaseUrl: db.url } : { dataDir: ':memory:' });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });

  it('equals ratchet.db_now() at offset 0 and with the clock moved either way', async () => {
    for (const offset of [0, 123_456, -5_000, 0]) {
      await store.db.query('UPDATE ratchet.clock SET offset_ms = $1 WHERE id = 1', [offset]);
      const [row] = await store.db.query<{ fn: Date; inline: Date; now: Date }>(
        `SELECT ratchet.db_now() AS fn, ${DB_NOW_EXPR} AS inline, now() AS now`,
      );
      expect(new Date(row!.inline).getTime()).toBe(new Date(row!.fn).getTime());
      expect(new Date(row!.inline).getTime() - new Date(row!.now).getTime()).toBe(offset);
    }
  });
});
