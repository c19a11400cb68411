import pg from 'pg';
import { DatabaseUnavailableError, isConnectionError } from './db-errors.js';
import type { Db, Queryable, Row } from './db.js';
import { migratePostgres } from './migrate.js';

export interface PostgresOptions {
  connectionString: string;
  /** Pool size; default 10. */
  max?: number;
  /** Give up on a new connection after this long; default 10 s. */
  connectionTimeoutMs?: number;
  /** Per-statement timeout on the server side; default none. */
  statementTimeoutMs?: number;
  /**
   * Client-side limit on one statement's answer (default 10 s). A statement that does not
   * answer in time is an error (ownership *unknown*), and its connection is destroyed, so a
   * black-holed link cannot hold a pooled connection forever.
   */
  queryTimeoutMs?: number;
  applicationName?: string;
}

function wrap(client: pg.Pool | pg.PoolClient): Queryable {
  return {
    async query<R extends Row>(text: string, params: readonly unknown[] = [], name?: string): Promise<R[]> {
      try {
        const res = await client.query<R>(name ? { name, text, values: params as unknown[] } : { text, values: params as unknown[] });
        return res.rows;
      } catch (err) {
        throw isConnectionError(err) ? new DatabaseUnavailableError(err) : err;
      }
    },
  };
}

export function createPostgresDb(opts: PostgresOptions): Db {
  const pool = new pg.Pool({
    connectionString: opts.connectionString,
    max: opts.max ?? 10,
    connectionTimeoutMillis: opts.connectionTimeoutMs ?? 10_000,
    application_name: opts.applicationName ?? 'ratchet',
    ...(opts.statementTimeoutMs ? { statement_timeout: opts.statementTimeoutMs } : {}),
    keepAlive: true,
    query_timeout: opts.queryTimeoutMs ?? 10_000,
    // Ratchet's statements are short and index-driven: JIT only ever adds compile time.
    options: '-c jit=off',
  });
  // An idle client's error (server restart, cut link) must not crash the process; the next query reports it.
  pool.on('error', () => {});
  // A client that errors while checked out but between queries (or while being destroyed after
  // a timeout) emits 'error' with no listener, which would crash the process. Queries still get
  // their own errors; this only keeps a dying connection from taking the worker with it.
  pool.on('connect', (client) => client.on('error', () => {}));

  const connect = async (): Promise<pg.PoolClient> => {
    try {
      return await pool.connect();
    } catch (err) {
      throw isConnectionError(err) ? new DatabaseUnavailableError(err) : err;
    }
  };

  return {
    kind: 'postgres',
    async query<R extends Row>(text: string, params: readonly unknown[] = [], name?: string): Promise<R[]> {
      const client = await connect();
      let broken = false;
      try {
        return await wrap(client).query<R>(text, params, name);
      } catch (err) {
        broken = err instanceof DatabaseUnavailableError;
        throw err;
      } finally {
        client.release(broken ? true : undefined);
      }
    },
    async transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T> {
      const client = await connect();
      const tx = wrap(client);
      let broken = false;
      try {
        await tx.query('BEGIN');
        const out = await fn(tx);
        await tx.query('COMMIT');
        return out;
      } catch (err) {
        broken = err instanceof DatabaseUnavailableError;
        if (!broken) await client.query('ROLLBACK').catch(() => { broken = true; });
        throw err;
      } finally {
        client.release(broken ? true : undefined);
      }
    },
    async withConnection<T>(fn: (conn: Queryable) => Promise<T>): Promise<T> {
      const client = await connect();
      let broken = false;
      try {
        return await fn(wrap(client));
      } catch (err) {
        broken = err instanceof DatabaseUnavailableError;
        throw err;
      } finally {
        client.release(broken ? true : undefined);
      }
    },
    async migrate() {
      const client = await connect();
      try {
        await migratePostgres(client);
      } finally {
        client.release();
      }
    },
    async close() {
      await pool.end();
    },
  };
}
