import type { PGlite } from '@electric-sql/pglite';
import type pg from 'pg';

/**
 * A pool-like face for PGlite, enough for the receiver's fence guard (`connect()` lending a
 * client with `query()` and `release()`). PGlite is one connection, so a "client" is that
 * connection held exclusively: `connect()` waits until the previous holder releases it, and
 * transactions run one at a time. Fine for a demo; a real receiver uses a pg.Pool.
 */
export interface PoolLike {
  connect(): Promise<pg.PoolClient>;
  query<R extends pg.QueryResultRow = pg.QueryResultRow>(text: string, params?: unknown[]): Promise<{ rows: R[] }>;
  end(): Promise<void>;
}

export function pglitePool(pglite: PGlite): PoolLike {
  let tail: Promise<void> = Promise.resolve();

  async function connect(): Promise<pg.PoolClient> {
    let unlock!: () => void;
    const previous = tail;
    tail = new Promise<void>((resolve) => {
      unlock = resolve;
    });
    await previous;
    let released = false;
    const client = {
      async query(text: string, params?: unknown[]) {
        if (released) throw new Error('pglitePool: query on a released client');
        const r = await pglite.query(text, params);
        return { rows: r.rows, rowCount: r.affectedRows ?? r.rows.length, fields: r.fields };
      },
      release(err?: Error | boolean) {
        if (released) return;
        released = true;
        // A client released broken may sit in an open transaction: end it before the next holder.
        if (err)
          void pglite
            .query('ROLLBACK')
            .catch(() => {})
            .finally(unlock);
        else unlock();
      },
    };
    return client as unknown as pg.PoolClient;
  }

  return {
    connect,
    async query<R extends pg.QueryResultRow>(text: string, params?: unknown[]) {
      const client = await connect();
      try {
        return { rows: (await client.query<R>(text, params)).rows };
      } finally {
        client.release();
      }
    },
    end: () => pglite.close(),
  };
}
