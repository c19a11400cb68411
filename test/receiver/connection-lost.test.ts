import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createFenceGuard, type FenceGuard } from '../../src/receiver/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startTcpProxy, type TcpProxy } from '../helpers/tcp-proxy.js';

/**
 * The guard's database connection dies mid-request, while no statement of the guard is running
 * (the handler is awaiting something else). A checked-out pg client has no error listener of
 * the pool's, so before the fix its 'error' event was unhandled and killed the receiver's
 * process (found by the chaos soak, seed 1: a PostgreSQL restart during an effect). Now the
 * request fails with the connection error, the client is discarded, nothing is kept, and the
 * request's retry applies the effect once.
 */
let db: TestDatabase;
let proxy: TcpProxy;
let pool: pg.Pool;
let guard: FenceGuard;

beforeAll(async () => {
  db = await createTestDatabase('receiver_conn_lost', { empty: true });
  await db.query('CREATE TABLE app_effects (id serial PRIMARY KEY, key text NOT NULL)');
  const u = new URL(db.url);
  proxy = await startTcpProxy({ target: { host: u.hostname, port: Number(u.port || 5432) } });
  pool = new pg.Pool({ connectionString: proxy.url(db.url), max: 4 }); // no listener on checked-out clients: the guard's job
  pool.on('error', () => {});
  guard = createFenceGuard(pool);
  await guard.migrate();
});

afterAll(async () => {
  await pool?.end();
  await proxy?.close();
  await db?.drop();
});

const effects = async (key: string) =>
  Number((await db.query<{ n: string }>('SELECT count(*) AS n FROM app_effects WHERE key = $1', [key]))[0]?.n);

describe('fence guard: its connection dies between statements', () => {
  it('fails the request (the process survives), keeps nothing, and a retry applies the effect once', async () => {
    const key = 'case:conn-lost:1';
    const unhandled: unknown[] = [];
    const onUncaught = (err: unknown) => unhandled.push(err);
    process.on('uncaughtException', onUncaught);
    try {
      const first = guard.run(key, '7', async (tx) => {
        await tx.query('INSERT INTO app_effects (key) VALUES ($1)', [key]);
        proxy.setMode('reset'); // the connection dies while the handler awaits something else
        await new Promise((r) => setTimeout(r, 200));
        return { status: 201, body: { ok: true } };
      });
      await expect(first).rejects.toThrow();
      await new Promise((r) => setTimeout(r, 100));
      expect(unhandled).toEqual([]);
    } finally {
      process.off('uncaughtException', onUncaught);
    }
    proxy.setMode('pass');
    expect(await effects(key)).toBe(0);
    const retry = await guard.run(key, '8', async (tx) => {
      await tx.query('INSERT INTO app_effects (key) VALUES ($1)', [key]);
      return { status: 201, body: { ok: true } };
    });
    expect(retry.verdict).toBe('applied');
    expect(await effects(key)).toBe(1);
  });

  it('a pool-like wrapper whose clients are no EventEmitter (e.g. over PGlite) still works', async () => {
    const wrapped = createFenceGuard({
      async connect() {
        const c = await pool.connect();
        return { query: c.query.bind(c), release: c.release.bind(c) } as unknown as pg.PoolClient;
      },
    });
    const key = 'case:conn-lost:wrapped';
    const result = await wrapped.run(key, '3', async (tx) => {
      await tx.query('INSERT INTO app_effects (key) VALUES ($1)', [key]);
      return { status: 201, body: { ok: true } };
    });
    expect(result.verdict).toBe('applied');
    expect(await effects(key)).toBe(1);
  });

  it('migrate() on a connection that dies meanwhile fails without killing the process', async () => {
    proxy.setMode('reset');
    await expect(guard.migrate()).rejects.toThrow();
    proxy.setMode('pass');
    await guard.migrate();
  });
});
