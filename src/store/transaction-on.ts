import type { Queryable } from './db.js';
import { DatabaseUnavailableError } from './db-errors.js';

/**
 * BEGIN … COMMIT on a connection the caller holds (db.transaction, and the limited claim's
 * transactions made again on one connection): rolled back when `fn` throws, with `fn`'s error; a
 * connection that cannot roll back is reported unavailable (DatabaseUnavailableError, its cause
 * `fn`'s error), so withConnection destroys it instead of handing it back to the pool.
 */
export async function transactionOn<T>(conn: Queryable, fn: (tx: Queryable) => Promise<T>): Promise<T> {
  await conn.query('BEGIN');
  try {
    const out = await fn(conn);
    await conn.query('COMMIT');
    return out;
  } catch (err) {
    if (!(err instanceof DatabaseUnavailableError)) {
      try {
        await conn.query('ROLLBACK');
      } catch {
        throw new DatabaseUnavailableError(err);
      }
    }
    throw err;
  }
}
