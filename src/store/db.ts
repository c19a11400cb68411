/**
 * The one interface the store speaks: a PostgreSQL pool or an embedded PGlite, same SQL.
 * Hot statements pass a `name` so the pg driver prepares them once per connection.
 */
import type { ListenHandlers, Listener } from './listener.js';

export type Row = Record<string, unknown>;

export interface QueryOptions {
  /**
   * A time limit on this one statement, in ms from when it is asked for (a connection still to
   * be opened counts). Past it the statement is abandoned and its connection destroyed, never
   * handed out again; the call fails with DatabaseUnavailableError (its outcome unknown: it
   * may still commit). PGlite, one in-process connection, ignores it.
   */
  timeoutMs?: number;
}

export interface Queryable {
  query<R extends Row = Row>(text: string, params?: readonly unknown[], name?: string, opts?: QueryOptions): Promise<R[]>;
}

/**
 * A connection of one's own, outside the pool, for a caller that must never queue behind the
 * pool nor inherit one of its dead connections (the lease keeper). Opened on first use; after
 * a statement fails for want of an answer (time limit, reset, refused) the connection is
 * destroyed and the next statement opens a fresh one.
 */
export interface DbSession extends Queryable {
  close(): Promise<void>;
}

export interface Db extends Queryable {
  readonly kind: 'postgres' | 'pglite';
  /**
   * Runs `fn` in one transaction on one connection; rolls back when it throws. `idleLimitMs`: PostgreSQL
   * ends the transaction when it waits that long for the client's next statement (./transaction-on.ts);
   * PGlite, one connection in this process, has nothing to free and ignores it.
   */
  transaction<T>(fn: (tx: Queryable) => Promise<T>, opts?: { idleLimitMs?: number }): Promise<T>;
  /** Runs `fn` with one dedicated connection (outside a transaction), e.g. to hold an advisory lock. */
  withConnection<T>(fn: (conn: Queryable) => Promise<T>): Promise<T>;
  /** A connection of its own, outside the pool (see DbSession); `label` names it to the server. */
  session(label: string): DbSession;
  /**
   * LISTEN on `channel` over a connection of its own (PostgreSQL only; absent on PGlite, whose
   * readers poll). See ./listener.ts.
   */
  listen?(channel: string, on: ListenHandlers): Listener;
  /** Applies the committed migrations under an advisory lock. */
  migrate(): Promise<void>;
  close(): Promise<void>;
}

/** A statement that did not answer within its QueryOptions.timeoutMs (the cause of a DatabaseUnavailableError). */
export class StatementTimeLimitError extends Error {
  readonly code = 'statement_time_limit';
  constructor(readonly limitMs: number) {
    super(`no answer within the statement's time limit of ${limitMs} ms`);
    this.name = 'StatementTimeLimitError';
  }
}

/** Rejects with StatementTimeLimitError when `work` has not settled within `limitMs` (then calls `onLimit` once). */
export function withTimeLimit<T>(work: Promise<T>, limitMs: number | undefined, onLimit: () => void): Promise<T> {
  if (limitMs === undefined) return work;
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(
      () => {
        work.catch(() => {}); // abandoned: whatever it does later is not waited for
        onLimit();
        reject(new StatementTimeLimitError(limitMs));
      },
      Math.max(0, Math.min(limitMs, 2 ** 31 - 1)),
    );
    work.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}
