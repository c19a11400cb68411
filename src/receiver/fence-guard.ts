import type pg from 'pg';
import { InvalidInputError } from '../errors.js';
import { InvalidHandlerResponseError } from './errors.js';
import { assertIdempotencyKey, parseFence } from './fence.js';
import { createMiddleware, type HttpHandler, type MiddlewareOptions, type RequestListener } from './http.js';
import { DEFAULT_RECEIVER_SCHEMA, SCHEMA_NAME, advisoryLockId, receiverSql, type EffectRow, type ReceiverSql } from './sql.js';

/** Anything that lends a pg client: a `pg.Pool`, or a wrapper around one. */
export interface GuardPool {
  connect(): Promise<pg.PoolClient>;
}

export interface FenceGuardOptions {
  /** Schema holding the guard's `effects` table (default `ratchet_receiver`). */
  schema?: string;
}

/** What a handler answers. A status >= 500 is sent but never stored. */
export interface GuardResponse {
  status: number;
  body: unknown;
}

/**
 * applied: the handler ran and its response was stored with its write.
 * replayed: the key's stored response, handler not called.
 * stale_fence: a higher fence was seen for this key; handler not called.
 * in_progress: another request holds this key right now; handler not called.
 * not_stored: the handler answered 5xx; its write was rolled back, the response not stored.
 */
export type GuardVerdict = 'applied' | 'replayed' | 'stale_fence' | 'in_progress' | 'not_stored';

export interface GuardResult extends GuardResponse {
  verdict: GuardVerdict;
  replayed: boolean;
}

/** The effect: runs inside the guard's transaction; `tx` is that transaction's client. Never COMMIT or ROLLBACK on it. */
export type EffectHandler = (tx: pg.ClientBase) => Promise<GuardResponse>;

export interface FenceGuard {
  readonly schema: string;
  /** Creates the schema and table if absent (idempotent, safe to call concurrently). */
  migrate(): Promise<void>;
  /** Runs `handler` at most once per key, fenced: see GuardVerdict. `fence` is a decimal string or bigint. */
  run(key: string, fence: string | bigint, handler: EffectHandler): Promise<GuardResult>;
  /** A Node http request listener around `handler` (Idempotency-Key, X-Execution-Fence, JSON body). */
  middleware(handler: HttpHandler, opts?: MiddlewareOptions): RequestListener;
}

const SAVEPOINT = 'ratchet_receiver_effect';

const IN_PROGRESS: GuardResult = { status: 409, body: { error: 'in_progress' }, verdict: 'in_progress', replayed: false };

function checkResponse(response: unknown): { status: number; body: unknown; json: string } {
  if (typeof response !== 'object' || response === null) throw new InvalidHandlerResponseError('not an object { status, body }');
  const { status, body } = response as { status?: unknown; body?: unknown };
  if (typeof status !== 'number' || !Number.isInteger(status) || status < 200 || status > 599) {
    throw new InvalidHandlerResponseError(`status must be an integer in 200..599, got ${String(status)}`);
  }
  let json: string;
  try {
    json = JSON.stringify(body ?? null);
  } catch (cause) {
    throw new InvalidHandlerResponseError(`body is not JSON-serialisable (${(cause as Error).message})`, { cause });
  }
  return { status, body: body ?? null, json };
}

function isLockNotAvailable(err: unknown): boolean {
  return (err as { code?: unknown } | null)?.code === '55P03';
}

export function createFenceGuard(db: GuardPool, opts: FenceGuardOptions = {}): FenceGuard {
  const schema = opts.schema ?? DEFAULT_RECEIVER_SCHEMA;
  if (!SCHEMA_NAME.test(schema)) throw new InvalidInputError('schema must be a lowercase SQL identifier', 'opts.schema', { schema });
  const sql: ReceiverSql = receiverSql(schema);

  async function migrate(): Promise<void> {
    const client = await db.connect();
    let broken: Error | undefined;
    try {
      await client.query('BEGIN');
      try {
        await client.query(sql.lock, [sql.migrateLockId]);
        for (const statement of sql.migrate) await client.query(statement);
        await client.query('COMMIT');
      } catch (err) {
        await client.query('ROLLBACK').catch((e: Error) => { broken = e; });
        throw err;
      }
    } finally {
      client.release(broken);
    }
  }

  async function run(key: string, fence: string | bigint, handler: EffectHandler): Promise<GuardResult> {
    assertIdempotencyKey(key);
    const wanted = parseFence(fence); // both checked before any connection: bad input writes nothing
    const client = await db.connect();
    let open = false;
    let broken: Error | undefined;
    const end = async <T>(statement: 'COMMIT' | 'ROLLBACK', result: T): Promise<T> => {
      await client.query(statement);
      open = false;
      return result;
    };
    try {
      // READ COMMITTED explicitly: each statement must see what the previous key holder committed.
      await client.query('BEGIN ISOLATION LEVEL READ COMMITTED');
      open = true;
      const lock = await client.query<{ locked: boolean }>(sql.tryLock, [advisoryLockId(schema, key)]);
      if (lock.rows[0]?.locked !== true) return await end('ROLLBACK', IN_PROGRESS);

      await client.query(sql.insertIfAbsent, [key, wanted.toString()]);
      let row: EffectRow | undefined;
      try {
        row = (await client.query<EffectRow>(sql.lockRow, [key])).rows[0];
      } catch (err) {
        if (isLockNotAvailable(err)) return await end('ROLLBACK', IN_PROGRESS);
        throw err;
      }
      if (!row) throw new Error(`ratchet/receiver: effect row for key vanished under lock (schema ${schema})`);

      const highest = BigInt(row.fence);
      if (wanted < highest) {
        return await end('ROLLBACK', {
          status: 409, body: { error: 'stale_fence', highest: highest.toString() }, verdict: 'stale_fence', replayed: false,
        });
      }
      if (wanted > highest) await client.query(sql.raiseFence, [key, wanted.toString()]);
      if (row.status === 'done') {
        // The effect happened once; a higher fence is recorded but still gets the stored answer.
        return await end('COMMIT', { status: row.response_status ?? 200, body: row.response_body, verdict: 'replayed', replayed: true });
      }

      await client.query(`SAVEPOINT ${SAVEPOINT}`);
      let response: ReturnType<typeof checkResponse>;
      try {
        response = checkResponse(await handler(client));
      } catch (handlerError) {
        // The handler's write is undone; the fence it was admitted with stays recorded.
        try {
          await client.query(`ROLLBACK TO SAVEPOINT ${SAVEPOINT}`);
          await end('COMMIT', undefined);
        } catch (cleanupError) {
          throw new AggregateError([handlerError, cleanupError], 'ratchet/receiver: the handler failed and the guard could not record its fence');
        }
        throw handlerError;
      }
      if (response.status >= 500) {
        await client.query(`ROLLBACK TO SAVEPOINT ${SAVEPOINT}`);
        return await end('COMMIT', { status: response.status, body: response.body, verdict: 'not_stored', replayed: false });
      }
      // Fails loudly if the handler ended the transaction itself.
      await client.query(`RELEASE SAVEPOINT ${SAVEPOINT}`);
      await client.query(sql.storeResponse, [key, response.status, response.json]);
      return await end('COMMIT', { status: response.status, body: response.body, verdict: 'applied', replayed: false });
    } catch (err) {
      if (open) await client.query('ROLLBACK').catch((e: Error) => { broken = e; });
      throw err;
    } finally {
      client.release(broken);
    }
  }

  const guard: FenceGuard = {
    schema,
    migrate,
    run,
    middleware: (handler, middlewareOpts) => createMiddleware(run, handler, middlewareOpts),
  };
  return guard;
}
