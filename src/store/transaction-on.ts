import type { Queryable } from './db.js';
import { DatabaseUnavailableError } from './db-errors.js';

/**
 * The idle limit of the transactions that hold rows or locks other workers wait for: a limited
 * claim (the class lock, its candidates FOR UPDATE, their keys), a stage beginning a wait (its own
 * running stage, FOR UPDATE, whose expired lease another worker would reclaim) and the sweeper's
 * wake-up of due waits (runs, waits, stages). A worker paused in the middle (SIGSTOP, a long GC
 * pause) would otherwise keep them from every other worker until its connection died: a 15-minute
 * soak saw a reclaim 4.3 s past its lease this way. Such a transaction cut short commits nothing;
 * its caller asks again (a claim loop after its back-off, the sweeper at its next tick).
 */
export const ROW_HOLDING_IDLE_LIMIT_MS = 1000;

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
  try {
    // No parameters: one simple-protocol round trip, both statements (a SET that failed after BEGIN is rolled back below).
    await conn.query(idle === null ? 'BEGIN' : `BEGIN; SET LOCAL idle_in_transaction_session_timeout = ${idle}`);
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
