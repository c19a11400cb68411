import pg from 'pg';
import { DatabaseUnavailableError, isConnectionError } from './db-errors.js';
import { StatementTimeLimitError, withTimeLimit, type Db, type DbSession, type QueryOptions, type Queryable, type Row } from './db.js';
import { createPgListener } from './listener.js';
import { transactionOn } from './transaction-on.js';
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

/*
 * Column parsers of the answers (pg's defaults otherwise). A finish of 10 rows answers db_now
 * 10 times, the same text, and a claim's rows carry the same db_now too: a timestamptz text equal to
 * the last one parsed is the same instant, made a new Date from its time (no shared mutable Date)
 * instead of parsed again by postgres-date; anything that is not a valid Date (infinity) is not kept.
 * json/jsonb: the empty array every finish row answers as `woken` is not handed to JSON.parse.
 * These are Ratchet's pool's own: pg's timestamptz parser is taken once, at import, and an application
 * that later calls pg.types.setTypeParser for timestamptz, json or jsonb does not change Ratchet's
 * answers (which read Dates and parsed JSON); other types still follow pg's global table.
 */
const TIMESTAMPTZ_OID = 1184;
const JSON_OID = 114;
const JSONB_OID = 3802;
const parseTimestamptzText = pg.types.getTypeParser(TIMESTAMPTZ_OID, 'text') as (text: string) => unknown;
let lastTimestamptzText = '';
let lastTimestamptzMs = 0;
function parseTimestamptz(text: string): unknown {
  if (text === lastTimestamptzText) return new Date(lastTimestamptzMs);
  const parsed = parseTimestamptzText(text);
  if (parsed instanceof Date && !Number.isNaN(parsed.getTime())) {
    lastTimestamptzText = text;
    lastTimestamptzMs = parsed.getTime();
  }
  return parsed;
}
const parseJson = (text: string): unknown => (text === '[]' ? [] : JSON.parse(text));
const typeParsers = {
  getTypeParser(oid: number, format?: string): unknown {
    if (format === undefined || format === 'text') {
      if (oid === TIMESTAMPTZ_OID) return parseTimestamptz;
      if (oid === JSONB_OID || oid === JSON_OID) return parseJson;
    }
    return (pg.types.getTypeParser as (oid: number, format?: string) => unknown)(oid, format);
  },
} as unknown as pg.CustomTypesConfig;

/** Closes a client's socket at once (a hung statement would otherwise hold it; a graceful end waits for an answer). */
function destroyClient(client: pg.ClientBase): void {
  (client as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream?.destroy();
}

const statement = (text: string, params: readonly unknown[], name?: string) =>
  name ? { name, text, values: params as unknown[] } : { text, values: params as unknown[] };

/** Statements on one checked-out client; a statement past its time limit destroys the client (the caller releases it as broken). */
function wrap(client: pg.PoolClient): Queryable {
  return {
    async query<R extends Row>(text: string, params: readonly unknown[] = [], name?: string, opts: QueryOptions = {}): Promise<R[]> {
      try {
        const res = await withTimeLimit(client.query<R>(statement(text, params, name)), opts.timeoutMs, () => destroyClient(client));
        // Text of several statements (no parameters) answers one result each: the last one's rows.
        return Array.isArray(res) ? ((res.at(-1) as pg.QueryResult<R> | undefined)?.rows ?? []) : res.rows;
      } catch (err) {
        throw err instanceof StatementTimeLimitError || isConnectionError(err) ? new DatabaseUnavailableError(err) : err;
      }
    },
  };
}

/**
 * A connection outside the pool (see DbSession): one pg.Client, opened on first use, destroyed
 * after a statement that got no answer (time limit, reset, refused) or a failed connect, so
 * the next statement opens a fresh one instead of waiting on a dead socket. A statement's time limit counts the
 * connect too. Statements of one session run one after another on its connection.
 */
function createSession(config: pg.ClientConfig): DbSession {
  let client: pg.Client | null = null;
  let ready: Promise<unknown> | null = null;
  const discard = (c: pg.Client) => {
    if (client === c) {
      client = null;
      ready = null;
    }
    destroyClient(c);
    c.end().catch(() => {});
  };
  return {
    async query<R extends Row>(text: string, params: readonly unknown[] = [], name?: string, opts: QueryOptions = {}): Promise<R[]> {
      if (!client) {
        const fresh = new pg.Client(config);
        fresh.on('error', () => {}); // a dying connection reports through its statement, never by crashing the process
        client = fresh;
        ready = fresh.connect().catch((err: unknown) => {
          discard(fresh); // whatever the reason (refused, refused auth...), the next statement dials again
          throw err;
        });
      }
      const c = client;
      const connected = ready!;
      const work = (async () => {
        await connected;
        return (await c.query<R>(statement(text, params, name))).rows;
      })();
      try {
        return await withTimeLimit(work, opts.timeoutMs, () => discard(c));
      } catch (err) {
        if (err instanceof StatementTimeLimitError || isConnectionError(err)) {
          discard(c);
          throw new DatabaseUnavailableError(err);
        }
        throw err;
      }
    },
    async close() {
      const c = client;
      client = null;
      ready = null;
      if (c) discard(c);
    },
  };
}

export function createPostgresDb(opts: PostgresOptions): Db {
  const connection = {
    connectionString: opts.connectionString,
    application_name: opts.applicationName ?? 'ratchet',
    keepAlive: true,
    // Ratchet's statements are short and index-driven: JIT only ever adds compile time.
    options: '-c jit=off',
    types: typeParsers,
  };
  const pool = new pg.Pool({
    ...connection,
    max: opts.max ?? 10,
    // pg's default closes a client idle for 10 s; each new backend plans the finish and the claims again (6 times each,
    // 15-85 ms a plan: PERF-NOTES §14) and fills its catalog caches. A worker's pool goes idle between bursts: keep a minute.
    idleTimeoutMillis: 60_000,
    connectionTimeoutMillis: opts.connectionTimeoutMs ?? 10_000,
    ...(opts.statementTimeoutMs ? { statement_timeout: opts.statementTimeoutMs } : {}),
    query_timeout: opts.queryTimeoutMs ?? 10_000,
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

  async function withConnection<T>(fn: (conn: Queryable) => Promise<T>): Promise<T> {
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
  }

  return {
    kind: 'postgres',
    query<R extends Row>(text: string, params: readonly unknown[] = [], name?: string, opts?: QueryOptions): Promise<R[]> {
      return withConnection((conn) => conn.query<R>(text, params, name, opts));
    },
    transaction<T>(fn: (tx: Queryable) => Promise<T>, txOpts?: { idleLimitMs?: number }): Promise<T> {
      return withConnection((conn) => transactionOn(conn, fn, txOpts));
    },
    withConnection,
    session(label: string) {
      // Server side, a statement whose client gave up may still wait (on a lock, say): it is
      // cancelled after the pool's answer limit, so an abandoned one cannot linger.
      return createSession({
        ...connection,
        application_name: `${connection.application_name}:${label}`,
        statement_timeout: opts.statementTimeoutMs ?? opts.queryTimeoutMs ?? 10_000,
      });
    },
    listen(channel, on) {
      return createPgListener({ ...connection, application_name: `${connection.application_name}:listen` }, channel, on);
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
