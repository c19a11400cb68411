import type { Logger } from 'pino';
import { classifyDbError, DatabaseUnavailableError } from './db-errors.js';

/** How long start-up waits for a database that does not answer, by default (`startupWaitMs`). */
export const DEFAULT_STARTUP_WAIT_MS = 30_000;

const FIRST_PAUSE_MS = 200;
const MAX_PAUSE_MS = 2_000;

/**
 * Runs one start-up step (migrations, the schedules' sync) and, while the database does not
 * answer (refused, reset, "Connection terminated unexpectedly", a statement time limit), runs it
 * again after a pause that doubles from 200 ms to 2 s, for at most `waitMs` in all. A process
 * started while PostgreSQL restarts or a link is down then starts once it is back, instead of
 * dying before it is ready. Each step must be safe to repeat (the migrator's transaction rolls
 * back whole; the sync is an upsert). Any other error (a host name that does not resolve included),
 * or the wait running out, is thrown:
 * the last `unavailable` one as DatabaseUnavailableError (code `database_unavailable`). A database
 * the URL names that does not exist (3D000) is DatabaseUnavailableError at once (exit 4, not 1).
 * `waitMs: 0` tries once.
 */
export async function retryWhileUnavailable<T>(
  step: string,
  fn: () => Promise<T>,
  opts: { waitMs?: number; logger?: Logger } = {},
): Promise<T> {
  const waitMs = opts.waitMs ?? DEFAULT_STARTUP_WAIT_MS;
  const giveUpAt = Date.now() + waitMs;
  let pause = FIRST_PAUSE_MS;
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn();
    } catch (err) {
      if (names(err, '3D000')) throw new DatabaseUnavailableError(err); // the URL names no database: not waited for
      if ((classifyDbError(err) !== 'unavailable' && !hasUnavailableCause(err)) || isUnknownHost(err)) throw err;
      const left = giveUpAt - Date.now();
      if (left <= 0) throw err instanceof DatabaseUnavailableError ? err : new DatabaseUnavailableError(err);
      opts.logger?.warn(
        { event: 'database_unavailable_at_start', step, attempt, retryInMs: Math.min(pause, left), err: (err as Error).message },
        `database unavailable during ${step}; trying again`,
      );
      await new Promise((r) => setTimeout(r, Math.min(pause, left)));
      pause = Math.min(MAX_PAUSE_MS, pause * 2);
    }
  }
}

/** A host name that does not resolve is a mistake in the URL far more often than a fault that passes: not waited for. */
function isUnknownHost(err: unknown): boolean {
  return (err as { code?: unknown } | null)?.code === 'ENOTFOUND';
}

/** The error and those along its `cause` (drizzle's migrator wraps the driver's), at most five deep. */
function causeChain(err: unknown): unknown[] {
  const chain: unknown[] = [];
  for (let e = err, i = 0; e && i < 6; i++, e = (e as { cause?: unknown }).cause) chain.push(e);
  return chain;
}

/** The error, or one along its `cause`, has this SQLSTATE. */
function names(err: unknown, sqlState: string): boolean {
  return causeChain(err).some((e) => (e as { code?: unknown }).code === sqlState);
}

/** drizzle's migrator wraps the driver's error: look along `cause`. */
function hasUnavailableCause(err: unknown): boolean {
  return causeChain(err)
    .slice(1)
    .some((e) => classifyDbError(e) === 'unavailable');
}
