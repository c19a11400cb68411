import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createPostgresDb } from '../../src/store/db-postgres.js';
import type { Db } from '../../src/store/db.js';
import { DatabaseUnavailableError } from '../../src/store/db-errors.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * db.transaction is withConnection + transactionOn (one BEGIN … COMMIT for the pool and for the
 * limited claim's transactions made again on one connection): a throwing body is rolled back with
 * its own error; a connection that cannot roll back is reported unavailable and never handed back
 * to the pool, so the next caller gets a working connection.
 */
describe('db.transaction (PostgreSQL)', () => {
  let tdb: TestDatabase;
  let db: Db;
  beforeAll(async () => {
    tdb = await createTestDatabase('transaction_on');
    db = createPostgresDb({ connectionString: tdb.url, max: 1 });
    await db.query('CREATE TABLE t (v int PRIMARY KEY)');
  });
  afterAll(async () => {
    await db?.close();
    await tdb?.drop();
  });

  it('commits the body, rolls back a throwing body with its own error', async () => {
    await expect(db.transaction((tx) => tx.query('INSERT INTO t VALUES (1) RETURNING v'))).resolves.toEqual([{ v: 1 }]);
    const boom = new Error('boom');
    await expect(
      db.transaction(async (tx) => {
        await tx.query('INSERT INTO t VALUES (2)');
        throw boom;
      }),
    ).rejects.toBe(boom);
    expect(await db.query('SELECT v FROM t ORDER BY v')).toEqual([{ v: 1 }]);
  });

  it('a connection that cannot roll back: database_unavailable with the body error as cause, and the pool (max 1) still works', async () => {
    const boom = new Error('body failed');
    const err = await db
      .transaction(async (tx) => {
        const [me] = await tx.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
        await tdb.query('SELECT pg_terminate_backend($1)', [me?.pid]);
        throw boom;
      })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DatabaseUnavailableError);
    expect((err as DatabaseUnavailableError).cause).toBe(boom);
    // The dead connection was destroyed, not returned: the only slot gives a live one.
    expect(await db.query('SELECT count(*)::int AS n FROM t')).toEqual([{ n: 1 }]);
  });
});
