import { execFile } from 'node:child_process';
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { PG_ADMIN_URL } from '../setup/services.js';
import { pgUrlVia, startTcpProxy, type TcpProxy } from './tcp-proxy.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Waits (bounded) until `pred` holds. */
async function until(pred: () => boolean, timeoutMs = 2_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!pred()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await sleep(10);
  }
}

async function timed<T>(p: Promise<T>): Promise<{ ms: number; value?: T; error?: Error & { code?: string } }> {
  const t0 = Date.now();
  try {
    const value = await p;
    return { ms: Date.now() - t0, value };
  } catch (error) {
    return { ms: Date.now() - t0, error: error as Error & { code?: string } };
  }
}

describe('tcp proxy, raw sockets against an echo server', () => {
  let echo: net.Server;
  let received = 0; // bytes the echo server got
  let proxy: TcpProxy;
  const sockets: net.Socket[] = [];

  beforeAll(async () => {
    echo = net.createServer((s) => {
      s.on('error', () => {});
      s.on('data', (d: Buffer) => {
        received += d.length;
        s.write(d);
      });
    });
    await new Promise<void>((r) => echo.listen({ host: '127.0.0.1', port: 0 }, () => r()));
    const addr = echo.address() as net.AddressInfo;
    proxy = await startTcpProxy({ target: { host: '127.0.0.1', port: addr.port } });
  });

  afterAll(async () => {
    for (const s of sockets) s.destroy();
    await proxy.close();
    await new Promise<void>((r) => echo.close(() => r()));
  });

  /** A client socket through the proxy that records what it receives and how it ended. */
  async function connect() {
    const s = net.connect({ host: '127.0.0.1', port: proxy.port });
    sockets.push(s);
    const state = { data: '', error: null as (Error & { code?: string }) | null, closed: false };
    s.on('data', (d: Buffer) => {
      state.data += d.toString();
    });
    s.on('error', (e) => {
      state.error = e;
    });
    s.on('close', () => {
      state.closed = true;
    });
    await new Promise<void>((resolve, reject) => {
      s.once('connect', resolve);
      s.once('error', reject);
    });
    return { s, state };
  }

  it('pass, blackhole (permanent for those connections), pass again, reset', async () => {
    const a = await connect();
    a.s.write('hello');
    await until(() => a.state.data === 'hello');
    expect(proxy.connections()).toBe(1);

    proxy.setMode('blackhole');
    expect(proxy.mode).toBe('blackhole');
    const before = received;
    a.s.write('lost');
    const b = await connect(); // accepted, but never forwarded
    b.s.write('lost too');
    await sleep(200);
    expect(received).toBe(before); // nothing delivered upstream
    expect(a.state.data).toBe('hello'); // nothing delivered back
    expect(b.state.data).toBe('');
    expect(a.state.closed || b.state.closed).toBe(false); // both stay open
    expect(proxy.stats().droppedBytes).toBe('lost'.length + 'lost too'.length);

    proxy.setMode('pass');
    a.s.write('still lost');
    b.s.write('still lost');
    const c = await connect();
    c.s.write('again');
    await until(() => c.state.data === 'again');
    await sleep(100);
    expect(a.state.data).toBe('hello'); // black-holed connections stay dead
    expect(b.state.data).toBe('');
    expect(proxy.connections()).toBe(3);

    proxy.setMode('reset');
    await until(() => a.state.closed && b.state.closed && c.state.closed);
    for (const x of [a, b, c]) expect(x.state.error?.code).toBe('ECONNRESET');
    expect(proxy.connections()).toBe(0);
    // New connections are reset at once.
    const d = net.connect({ host: '127.0.0.1', port: proxy.port });
    sockets.push(d);
    const err = await new Promise<Error & { code?: string }>((resolve) => {
      d.on('error', resolve);
      d.on('data', () => resolve(new Error('unexpected data')));
    });
    expect(err.code).toBe('ECONNRESET');

    proxy.setMode('pass');
    const e = await connect();
    e.s.write('back');
    await until(() => e.state.data === 'back');
  });

  it('hold keeps the client bytes (open and new connections) and sends them, in order, on pass', async () => {
    proxy.setMode('pass');
    const a = await connect();
    a.s.write('one');
    await until(() => a.state.data === 'one');
    proxy.setMode('hold');
    const before = received;
    a.s.write('late-');
    a.s.write('request');
    const b = await connect();
    b.s.write('new');
    await until(() => proxy.held().length === 2);
    await sleep(100);
    expect(received).toBe(before); // nothing reached the target
    expect(proxy.held().map((x) => x.toString())).toEqual(['late-request', 'new']);
    proxy.setMode('pass');
    await until(() => a.state.data === 'onelate-request' && b.state.data === 'new');
    expect(proxy.held()).toEqual([]);
    expect(proxy.stats().heldBytes).toBe('late-request'.length + 'new'.length);
    // Held bytes are dropped by a reset.
    proxy.setMode('hold');
    a.s.write('dropped');
    await until(() => proxy.held().length === 1);
    proxy.setMode('reset');
    await until(() => a.state.closed && b.state.closed);
    expect(a.state.data).toBe('onelate-request');
    proxy.setMode('pass');
  });

  it('url() and pgUrlVia() rewrite host and port only', () => {
    expect(proxy.url('postgres://root:pw@db.example:5432/test?sslmode=disable')).toBe(
      `postgres://root:pw@127.0.0.1:${proxy.port}/test?sslmode=disable`,
    );
    expect(pgUrlVia(proxy, 'redis://127.0.0.1:6379')).toBe(`redis://127.0.0.1:${proxy.port}`);
    expect(proxy.url('http://localhost/x')).toBe(`http://127.0.0.1:${proxy.port}/x`);
  });
});

describe('tcp proxy in front of PostgreSQL', () => {
  const target = new URL(PG_ADMIN_URL);
  let proxy: TcpProxy;
  const clients: pg.Client[] = [];

  beforeAll(async () => {
    proxy = await startTcpProxy({ target: { host: target.hostname, port: Number(target.port || 5432) } });
  });

  afterEach(() => proxy.setMode('pass'));

  afterAll(async () => {
    // Clients stuck on a black-holed connection never finish end(): destroy their sockets.
    for (const c of clients) {
      (c as unknown as { connection?: { stream?: net.Socket } }).connection?.stream?.destroy();
    }
    await proxy.close();
  });

  function client(extra: pg.ClientConfig = {}): pg.Client {
    const c = new pg.Client({ connectionString: proxy.url(PG_ADMIN_URL), connectionTimeoutMillis: 1000, query_timeout: 1000, ...extra });
    c.on('error', () => {}); // errors after the fact (resets) must not crash the test process
    clients.push(c);
    return c;
  }

  it('passes queries, black-holes them (timeouts, not fast failures), resets them, and recovers', async () => {
    const a = client();
    await a.connect();
    expect((await a.query<{ n: number }>('SELECT 1 AS n')).rows).toEqual([{ n: 1 }]);
    expect(proxy.connections()).toBe(1);

    proxy.setMode('blackhole');
    const q = await timed(a.query('SELECT 2'));
    expect(q.error?.message).toMatch(/timeout/i);
    expect(q.ms).toBeGreaterThanOrEqual(900);
    const b = client();
    const conn = await timed(b.connect());
    expect(conn.error?.message).toMatch(/timeout/i);
    expect(conn.ms).toBeGreaterThanOrEqual(900);

    // Back to pass: the black-holed connection stays dead, a new one works.
    proxy.setMode('pass');
    const again = await timed(a.query('SELECT 3'));
    expect(again.error?.message).toMatch(/timeout/i);
    const c = client();
    await c.connect();
    expect((await c.query<{ n: number }>('SELECT 4 AS n')).rows).toEqual([{ n: 4 }]);

    proxy.setMode('reset');
    const r = await timed(c.query('SELECT 5'));
    expect(r.error).toBeDefined();
    expect(r.error?.message).not.toMatch(/timeout/i);
    expect(r.ms).toBeLessThan(500);
    const d = client({ query_timeout: 5_000, connectionTimeoutMillis: 5_000 });
    const dr = await timed(d.connect());
    expect(dr.error).toBeDefined();
    expect(`${dr.error?.code ?? ''} ${dr.error?.message ?? ''}`).toMatch(/ECONNRESET|terminated/i);
    expect(dr.ms).toBeLessThan(500);
    await until(() => proxy.connections() === 0);

    proxy.setMode('pass');
    const e = client();
    await e.connect();
    expect((await e.query<{ n: number }>('SELECT 6 AS n')).rows).toEqual([{ n: 6 }]);
    await e.end();
    await until(() => proxy.connections() === 0);
  });

  it('serves a child process (the proxy lives in the test process)', async () => {
    // Plain CommonJS so no loader is needed; `pg` resolves from the project's node_modules.
    const script = `
      const pg = require('pg');
      const c = new pg.Client({ connectionString: process.env.URL, connectionTimeoutMillis: 1000, query_timeout: 1000 });
      c.on('error', () => {});
      (async () => {
        try { await c.connect(); const r = await c.query('SELECT 7 AS n'); console.log(JSON.stringify({ ok: r.rows[0].n })); }
        catch (e) { console.log(JSON.stringify({ error: e.message })); }
        process.exit(0);
      })();`;
    const run = () =>
      new Promise<Record<string, unknown>>((resolve, reject) => {
        // Asynchronous on purpose: a synchronous spawn would block the proxy's event loop.
        execFile(
          process.execPath,
          ['-e', script],
          { cwd: ROOT, env: { ...process.env, URL: pgUrlVia(proxy, PG_ADMIN_URL) }, timeout: 15_000 },
          (err, stdout) => (err ? reject(err) : resolve(JSON.parse(stdout.trim()) as Record<string, unknown>)),
        );
      });
    expect(await run()).toEqual({ ok: 7 });
    proxy.setMode('blackhole');
    expect(String((await run()).error)).toMatch(/timeout/i);
    proxy.setMode('reset');
    expect(String((await run()).error)).not.toMatch(/timeout/i);
    proxy.setMode('pass');
    expect(await run()).toEqual({ ok: 7 });
  });
});
