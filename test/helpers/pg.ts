import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { inject } from 'vitest';
import { databaseUrl, PG_ADMIN_URL } from '../setup/services.js';

export interface TestDatabase {
  name: string;
  url: string;
  /** Runs one query against the test database (outside the store, for assertions). */
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(text: string, params?: unknown[]): Promise<R[]>;
  drop(): Promise<void>;
}

async function admin<T>(fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: PG_ADMIN_URL });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

/**
 * A database of its own for one test file: a clone of the migrated template, or an empty
 * one (`empty: true`) for tests of the migrator itself. Dropped by `drop()`.
 */
export async function createTestDatabase(label: string, opts: { empty?: boolean } = {}): Promise<TestDatabase> {
  const name = `ratchet_t_${label
    .replace(/[^a-z0-9]/gi, '_')
    .toLowerCase()
    .slice(0, 30)}_${randomBytes(4).toString('hex')}`;
  const template = opts.empty ? 'template0' : inject('pgTemplate');
  await admin((c) => c.query(`CREATE DATABASE ${name} TEMPLATE ${template}`));
  const url = databaseUrl(name);
  const pool = new pg.Pool({ connectionString: url, max: 2 });
  pool.on('error', () => {});
  return {
    name,
    url,
    async query(text, params) {
      return (await pool.query(text, params)).rows;
    },
    async drop() {
      await pool.end();
      await admin((c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`));
    },
  };
}
