import { RatchetError } from '../errors.js';
import type { Db, Queryable } from './db.js';

/**
 * The database did not answer (refused, reset, timed out). For a lease statement this means
 * ownership is *unknown*, never lost: only a missing row means lost.
 */
export class DatabaseUnavailableError extends RatchetError {
  constructor(cause: unknown) {
    super('database_unavailable', `database unavailable: ${cause instanceof Error ? cause.message : String(cause)}`, {}, { cause });
  }
}

const CONNECTION_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
  '57P01',
  '57P02',
  '57P03',
  '57P05', // idle_session_timeout
  '25P03', // idle_in_transaction_session_timeout: the session is ended (ROW_HOLDING_IDLE_LIMIT_MS, ./transaction-on.ts)
  '08000',
  '08001',
  '08003',
  '08004',
  '08006',
]);

export function isConnectionError(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const code = (err as { code?: string }).code;
  if (code && CONNECTION_CODES.has(code)) return true;
  return /Connection terminated|connection timeout|timeout exceeded when trying to connect|Client has encountered a connection error|not queryable|Query read timeout/i.test(
    err.message,
  );
}

/**
 * What a failed statement means for the caller, by SQLSTATE (both drivers report it as `code`):
 * - `unavailable`: no answer, or the server could not take the statement now (connection lost,
 *   57014 cancelled by a statement time limit, 55P03 a lock time limit, class 53 out of
 *   resources). The outcome is unknown: ask again after a pause; a fenced statement is safe to repeat.
 * - `conflict`: a deadlock (40P01) or a serialisation failure (40001). The statement was rolled
 *   back and nothing was written: ask again at once.
 * - `unstorable`: the data itself was refused (class 22, a data exception such as a string
 *   jsonb cannot hold; class 54, a value past a limit). Asking again with the same data fails
 *   again: the row must change.
 * - `other`: anything else (a bug, a missing table): not retried blindly.
 */
export type DbErrorKind = 'unavailable' | 'conflict' | 'unstorable' | 'other';

const CONFLICT_CODES = new Set(['40001', '40P01']);
const BUSY_CODES = new Set(['57014', '55P03']);

export function classifyDbError(err: unknown): DbErrorKind {
  if (err instanceof DatabaseUnavailableError || isConnectionError(err)) return 'unavailable';
  const code = err instanceof Error ? (err as { code?: unknown }).code : undefined;
  if (typeof code !== 'string' || !/^[0-9A-Z]{5}$/.test(code)) return 'other';
  if (CONFLICT_CODES.has(code)) return 'conflict';
  if (BUSY_CODES.has(code) || code.startsWith('53')) return 'unavailable';
  if (code.startsWith('22') || code.startsWith('54')) return 'unstorable';
  return 'other';
}

/**
 * Tries `work` up to 5 times while PostgreSQL aborts it as a conflict (a deadlock, a serialisation failure):
 * the statement was rolled back, so asking again is safe. For one statement in autocommit or a whole transaction
 * (`db.transaction`, rolled back with everything it wrote), never for one statement inside a transaction (the
 * transaction is aborted with it).
 */
export async function onConflictAgain<T>(work: () => Promise<T>): Promise<T> {
  for (let i = 0; ; i++) {
    try {
      return await work();
    } catch (err) {
      if (i >= 4 || classifyDbError(err) !== 'conflict') throw err;
      await new Promise((res) => setTimeout(res, 20 * (i + 1)));
    }
  }
}

/**
 * `db.transaction(fn)`, asked again (onConflictAgain) when PostgreSQL aborts it as a deadlock or a serialisation
 * failure. For the API's transactions that lock a run, then one of its stages (a decision, a signal, a run retry),
 * while a finish or a claim that settles the run locks its stage, then the run: the aborted transaction wrote
 * nothing, and the caller gets its answer instead of a 503. `fn` runs again from the start: only statements on `tx`.
 */
export function transactionAgain<T>(db: Db, fn: (tx: Queryable) => Promise<T>, opts?: { idleLimitMs?: number }): Promise<T> {
  return onConflictAgain(() => db.transaction(fn, opts));
}
