import type pg from 'pg';
import { InvalidInputError } from '../errors.js';
import { toJsonText } from '../store/json.js';
import { HandlerEndedTransactionError, InvalidHandlerResponseError } from './errors.js';
import { assertFingerprint, assertIdempotencyKey, parseFence } from './fence.js';
import { createMiddleware, type HttpHandler, type MiddlewareOptions, type RequestListener } from './http.js';
import {
  DEFAULT_RECEIVER_SCHEMA,
  HANDLER_ENDED_TRANSACTION,
  SCHEMA_NAME,
  advisoryLockId,
  receiverSql,
  type EffectRow,
  type ReceiverSql,
} from './sql.js';

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
 * replayed: the key's stored response, handler not called (to any fence: the effect is done).
 * idempotency_key_reused: the key's effect is done for another request (another fingerprint); 422, handler not called.
 * stale_fence: the key's effect is not done and a higher fence was admitted; handler not called.
 * in_progress: another request holds this key right now; handler not called.
 * not_stored: the handler answered 5xx; its write was rolled back, the response not stored.
 */
export type GuardVerdict = 'applied' | 'replayed' | 'idempotency_key_reused' | 'stale_fence' | 'in_progress' | 'not_stored';

export interface GuardResult extends GuardResponse {
  verdict: GuardVerdict;
  replayed: boolean;
}

export interface RunOptions {
  /**
   * What identifies the request under its key (`requestFingerprint(method, target, body)` for
   * HTTP). Stored with the response; a done key asked with another fingerprint answers 422
   * `idempotency_key_reused` instead of another request's response. Without one, no comparison:
   * a call that passes no fingerprint gets the key's stored answer even when that answer was
   * stored with a fingerprint (on purpose: a programmatic caller retrying its own effect under
   * its own key). A caller that mixes requests under one key must pass a fingerprint on every call.
   */
  fingerprint?: string;
}

/** The effect: runs inside the guard's transaction; `tx` is that transaction's client. Never COMMIT or ROLLBACK on it. */
export type EffectHandler = (tx: pg.ClientBase) => Promise<GuardResponse>;

export interface FenceGuard {
  readonly schema: string;
  /** Creates or upgrades the schema and table (idempotent, safe to call concurrently; call it after upgrading). */
  migrate(): Promise<void>;
  /** Runs `handler` at most once per key, fenced: see GuardVerdict. `fence` is a decimal string or bigint. */
  run(key: string, fence: string | bigint, handler: EffectHandler, opts?: RunOptions): Promise<GuardResult>;
  /** A Node http request listener around `handler` (Idempotency-Key, X-Execution-Fence, JSON body, request fingerprint). */
  middleware(handler: HttpHandler, opts?: MiddlewareOptions): RequestListener;
}

const SAVEPOINT = 'ratchet_receiver_effect';

const IN_PROGRESS: GuardResult = { status: 409, body: { error: 'in_progress' }, verdict: 'in_progress', replayed: false };
const KEY_REUSED: GuardResult = {
  status: 422,
  body: { error: 'idempotency_key_reused' },
  verdict: 'idempotency_key_reused',
  replayed: false,
};

function checkResponse(response: unknown): { status: number; body: unknown; json: string } {
  if (typeof response !== 'object' || response === null) throw new InvalidHandlerResponseError('not an object { status, body }');
  const { status, body } = response as { status?: unknown; body?: unknown };
  if (typeof status !== 'number' || !Number.isInteger(status) || status < 200 || status > 599) {
    throw new InvalidHandlerResponseError(`status must be an integer in 200..599, got ${String(status)}`);
  }
  let json: string;
  try {
    // The rules of every jsonb column Ratchet writes: what PostgreSQL refuses (\u0000, lone surrogates,
    // absurd depth) or a round trip would change (Date, BigInt, NaN) is refused here, by name and path.
    json = toJsonText(body ?? null, 'response.body');
  } catch (cause) {
    const path = cause instanceof InvalidInputError ? cause.path : 'response.body';
    const reason = (cause as Error).message.replace(` (at ${path})`, '');
    throw new InvalidHandlerResponseError(`the body cannot be stored: ${reason}`, { cause, path });
  }
  return { status, body: body ?? null, json };
}

const sqlState = (err: unknown): unknown => (err as { code?: unknown } | null)?.code;
const isLockNotAvailable = (err: unknown): boolean => sqlState(err) === '55P03';
/** No transaction (25P01), no such savepoint (3B001), or the commit check fired (2D000): the handler ended the transaction. */
const isTransactionEnded = (err: unknown): boolean => ['25P01', '3B001', HANDLER_ENDED_TRANSACTION].includes(sqlState(err) as string);
/** A value PostgreSQL refused to store (data exception, or a program limit such as nesting depth). */
const isUnstorable = (err: unknown): boolean => typeof sqlState(err) === 'string' && /^(22|54)/.test(sqlState(err) as string);

/**
 * A checked-out pg client has no error listener of its pool's: a connection that dies while no
 * statement runs (the handler awaits something else) emits 'error', and unheard, that kills the
 * receiver's process. Heard here, the client is released as broken (discarded) and the next
 * statement fails with the connection error, so the request fails and nothing is kept.
 */
function watchConnection(client: pg.PoolClient, lost: (err: Error) => void): () => void {
  // A pool-like wrapper (GuardPool) may lend a client that is no EventEmitter (e.g. over PGlite): nothing to hear then.
  const emitter = client as Partial<Pick<pg.PoolClient, 'on' | 'off'>>;
  if (typeof emitter.on !== 'function' || typeof emitter.off !== 'function') return () => {};
  const onLost = (err: Error) => lost(err);
  emitter.on.call(client, 'error', onLost);
  return () => emitter.off!.call(client, 'error', onLost);
}

function replayOf(row: EffectRow, fingerprint: string | undefined): GuardResult {
  if (fingerprint !== undefined && row.request_hash !== null && row.request_hash !== fingerprint) return KEY_REUSED;
  return { status: row.response_status ?? 200, body: row.response_body, verdict: 'replayed', replayed: true };
}

export function createFenceGuard(db: GuardPool, opts: FenceGuardOptions = {}): FenceGuard {
  const schema = opts.schema ?? DEFAULT_RECEIVER_SCHEMA;
  if (!SCHEMA_NAME.test(schema)) throw new InvalidInputError('schema must be a lowercase SQL identifier', 'opts.schema', { schema });
  const sql: ReceiverSql = receiverSql(schema);

  async function migrate(): Promise<void> {
    const client = await db.connect();
    let broken: Error | undefined;
    const unwatch = watchConnection(client, (err) => {
      broken = err;
    });
    try {
      await client.query('BEGIN');
      try {
        await client.query(sql.lock, [sql.migrateLockId]);
        for (const statement of sql.migrate) await client.query(statement);
        await client.query('COMMIT');
      } catch (err) {
        await client.query('ROLLBACK').catch((e: Error) => {
          broken = e;
        });
        throw err;
      }
    } finally {
      unwatch();
      client.release(broken);
    }
  }

  /**
   * The order of the checks: (1) a done key answers its stored response to any fence, or 422
   * when the fingerprint differs (read without a lock: a done row never changes); (2) a key
   * another transaction holds is 409 in_progress; (3) a key not done refuses a fence lower
   * than the highest admitted (409 stale_fence); (4) the request is admitted (its fence kept,
   * the row opened) and the handler runs in a savepoint of the same transaction, whose
   * response is stored with the handler's writes and the fingerprint.
   */
  async function run(key: string, fence: string | bigint, handler: EffectHandler, runOpts: RunOptions = {}): Promise<GuardResult> {
    assertIdempotencyKey(key);
    const wanted = parseFence(fence); // all checked before any connection: bad input writes nothing
    const fingerprint = runOpts.fingerprint;
    assertFingerprint(fingerprint);
    const client = await db.connect();
    let open = false;
    let broken: Error | undefined;
    const unwatch = watchConnection(client, (err) => {
      broken = err;
    });
    const end = async <T>(statement: 'COMMIT' | 'ROLLBACK', result: T): Promise<T> => {
      await client.query(statement);
      open = false;
      return result;
    };
    try {
      const done = (await client.query<EffectRow>(sql.readRow, [key])).rows[0];
      if (done?.status === 'done') return replayOf(done, fingerprint);

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
      if (row.status === 'done') return await end('ROLLBACK', replayOf(row, fingerprint)); // done since the first read

      const highest = BigInt(row.fence);
      if (wanted < highest) {
        return await end('ROLLBACK', {
          status: 409,
          body: { error: 'stale_fence', highest: highest.toString() },
          verdict: 'stale_fence',
          replayed: false,
        });
      }
      await client.query(sql.admit, [key, wanted.toString()]);

      await client.query(`SAVEPOINT ${SAVEPOINT}`);
      let response: ReturnType<typeof checkResponse>;
      let stored = 0;
      try {
        response = checkResponse(await handler(client));
      } catch (err) {
        await undo(err);
        throw err; // the handler's own error (its SQL included) as it is: never relabelled as the body's
      }
      if (response.status < 500) {
        const params = [key, response.status, response.json, fingerprint ?? null];
        try {
          stored = (await client.query(sql.storeResponse, params)).rowCount ?? 0;
        } catch (err) {
          await undo(err);
          if (!isUnstorable(err)) throw err;
          const reason = `PostgreSQL refused to store the body (${(err as Error).message})`;
          throw new InvalidHandlerResponseError(reason, { cause: err, path: 'response.body' });
        }
      }
      if (response.status >= 500) {
        await undo();
        return { status: response.status, body: response.body, verdict: 'not_stored', replayed: false };
      }
      // Zero rows: the row is not open in this transaction any more, so the handler ended it.
      if (stored !== 1) throw new HandlerEndedTransactionError();
      await client.query(`RELEASE SAVEPOINT ${SAVEPOINT}`).catch((err: unknown) => {
        throw isTransactionEnded(err) ? new HandlerEndedTransactionError({ cause: err }) : err;
      });
      return await end('COMMIT', { status: response.status, body: response.body, verdict: 'applied', replayed: false });
    } catch (err) {
      if (open)
        await client.query('ROLLBACK').catch((e: Error) => {
          broken = e;
        });
      throw err;
    } finally {
      unwatch();
      client.release(broken);
    }

    /** The handler's writes are undone; the fence it was admitted with stays recorded, the row closed. */
    async function undo(handlerError?: unknown): Promise<void> {
      try {
        await client.query(`ROLLBACK TO SAVEPOINT ${SAVEPOINT}`);
        await client.query(sql.close, [key]);
        await end('COMMIT', undefined);
      } catch (cleanupError) {
        if (isTransactionEnded(cleanupError) || isTransactionEnded(handlerError)) {
          throw new HandlerEndedTransactionError({ cause: handlerError ?? cleanupError });
        }
        if (handlerError === undefined) throw cleanupError;
        throw new AggregateError(
          [handlerError, cleanupError],
          'ratchet/receiver: the handler failed and the guard could not record its fence',
        );
      }
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
