import type { PGlite } from '@electric-sql/pglite';
import type { Db, Queryable, Row } from './db.js';
import { migratePgliteDb } from './migrate.js';
import { createPglite } from './pglite-template.js';

/** Embedded PostgreSQL (PGlite): one connection, so transactions run one at a time. */
export async function createPgliteDb(dataDir: string | undefined): Promise<Db> {
  const pglite = await createPglite(dataDir); // a new cluster loads a cached empty one instead of running initdb
  const wrap = (q: Pick<PGlite, 'query'>): Queryable => ({
    async query<R extends Row>(text: string, params: readonly unknown[] = []): Promise<R[]> {
      return (await q.query<R>(text, params as unknown[])).rows;
    },
  });
  const root = wrap(pglite);
  return {
    kind: 'pglite',
    query: root.query,
    transaction: (fn) => pglite.transaction((tx) => fn(wrap(tx))),
    withConnection: (fn) => fn(root),
    // One in-process connection: there is no other to open, and no socket to hang.
    session: () => ({ query: root.query, close: async () => {} }),
    migrate: () => migratePgliteDb(pglite),
    async close() {
      await pglite.close();
    },
  };
}
