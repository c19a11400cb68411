import type { Queryable } from './db.js';
import { DatabaseUnavailableError } from './db-errors.js';

/**
 * BEGIN … COMMIT on a connection the caller holds (db.transaction, and the limited claim's
 * transactions made again on one connection): rolled back when `fn` throws, with `fn`'s error; a
 * connection that cannot roll back is reported unavailable (DatabaseUnavailableError, its cause
 * `fn`'s error), so withConnection destroys it instead of handing it back to the pool.
 *
 * `idleLimitMs`: PostgreSQL ends the session when the transaction waits longer than this for the
 * client's next statement (`idle_in_transaction_session_timeout`, set for this transaction only, in
 * BEGIN's own round trip). For a transaction that holds rows other workers need: a client paused in
 * the middle of it (SIGSTOP, a long GC pause, a blocked event loop) frees them within that time
 * instead of holding them until its connection dies.
 */
export async function transactionOn<T>(
  conn: Queryable,
  fn: (tx: Queryable) => Promise<T>,
  opts: { idleLimitMs?: number } = {},
): Promise<T> {
  const idle = opts.idleLimitMs === undefined ? null : Math.max(1, Math.round(opts.idleLimitMs));
  // No parameters: one simple-protocol round trip, both statements.
  await conn.query(idle === null ? 'BEGIN' : `BEGIN; SET LOCAL idle_in_transaction_session_timeout = ${idle}`);
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
