import { once } from 'node:events';
import { createServer, request as httpRequest, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createFenceGuard, type HttpHandlerContext } from '../../src/receiver/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

let db: TestDatabase;
let pool: pg.Pool;
let server: Server;
let url: string;
let calls = 0;
const errors: unknown[] = [];
let seq = 0;
const newKey = () => `http:${++seq}`;

/** The receiver's handler: one row per effect; `fail` in the body answers 503, `throw` throws. */
async function createCase(ctx: HttpHandlerContext) {
  calls += 1;
  const input = (ctx.body ?? {}) as { summary?: string; fail?: boolean; throw?: boolean };
  const r = await ctx.tx.query<{ id: number }>('INSERT INTO cases (key, fence, summary) VALUES ($1, $2, $3) RETURNING id', [
    ctx.key,
    ctx.fence,
    input.summary ?? null,
  ]);
  if (input.throw) throw new Error('handler exploded');
  if (input.fail) return { status: 503, body: { error: 'downstream_unavailable' } };
  return { status: 201, body: { id: r.rows[0]?.id, fence: ctx.fence } };
}

const caseCount = async (key: string) =>
  Number((await db.query<{ n: string }>('SELECT count(*) AS n FROM cases WHERE key = $1', [key]))[0]?.n);

/** A request through node:http, where a header given as an array is sent as several header lines. */
function rawPost(body: string, headers: Record<string, string | string[]>): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => {
        text += d;
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

function post(body: unknown, headers: Record<string, string>) {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
}

beforeAll(async () => {
  db = await createTestDatabase('receiver_http', { empty: true });
  pool = new pg.Pool({ connectionString: db.url, max: 8 });
  pool.on('error', () => {});
  const guard = createFenceGuard(pool);
  await guard.migrate();
  await db.query('CREATE TABLE cases (id serial PRIMARY KEY, key text NOT NULL, fence bigint NOT NULL, summary text)');
  server = createServer(guard.middleware(createCase, { onError: (err) => errors.push(err) }));
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/cases`;
});

afterAll(async () => {
  server?.closeAllConnections();
  await new Promise((r) => (server ? server.close(r) : r(undefined)));
  await pool?.end();
  await db?.drop();
});

describe('fence guard middleware over http', () => {
  it('runs the effect once, replays a repeated key to any fence', async () => {
    const key = newKey();
    const first = await post({ summary: 'check invoice' }, { 'idempotency-key': key, 'x-execution-fence': '42' });
    expect(first.status).toBe(201);
    expect(first.headers.get('content-type')).toMatch(/^application\/json/);
    const created = await first.json();
    expect(created).toMatchObject({ fence: '42' });

    const before = calls;
    const again = await post({ summary: 'check invoice' }, { 'idempotency-key': key, 'x-execution-fence': '42' });
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(await again.json()).toEqual(created);

    const lower = await post({ summary: 'check invoice' }, { 'idempotency-key': key, 'x-execution-fence': '41' });
    expect(lower.status).toBe(201);
    expect(lower.headers.get('idempotent-replayed')).toBe('true');
    expect(await lower.json()).toEqual(created);
    expect(calls).toBe(before);
    expect(await caseCount(key)).toBe(1);
  });

  it('concurrent requests with one key: exactly one effect', async () => {
    const key = newKey();
    const responses = await Promise.all(
      Array.from({ length: 8 }, () => post({ summary: 'race' }, { 'idempotency-key': key, 'x-execution-fence': '7' })),
    );
    const statuses = responses.map((r) => r.status);
    const bodies = await Promise.all(responses.map((r) => r.json() as Promise<Record<string, unknown>>));
    expect(await caseCount(key)).toBe(1);
    statuses.forEach((s, i) => {
      if (s === 409) {
        expect(bodies[i]).toEqual({ error: 'in_progress' });
        expect(responses[i]?.headers.get('retry-after')).toBe('1');
      } else expect(s).toBe(201);
    });
  });

  it('a 5xx is answered, not stored, and its write rolled back; the retry runs again', async () => {
    const key = newKey();
    const failed = await post({ fail: true }, { 'idempotency-key': key, 'x-execution-fence': '3' });
    expect(failed.status).toBe(503);
    expect(await failed.json()).toEqual({ error: 'downstream_unavailable' });
    expect(await caseCount(key)).toBe(0);
    const retried = await post({}, { 'idempotency-key': key, 'x-execution-fence': '3' });
    expect(retried.status).toBe(201);
    expect(retried.headers.get('idempotent-replayed')).toBeNull();
    expect(await caseCount(key)).toBe(1);
  });

  it('a handler that throws is 500 internal_error, reported to onError, its write rolled back', async () => {
    const key = newKey();
    const n = errors.length;
    const res = await post({ throw: true }, { 'idempotency-key': key, 'x-execution-fence': '1' });
    expect(res.status).toBe(500);
    expect(await res.json()).toEqual({ error: 'internal_error' });
    expect(errors.length).toBe(n + 1);
    expect(await caseCount(key)).toBe(0);
  });

  it.each([
    ['missing_idempotency_key', { 'x-execution-fence': '1' }],
    ['missing_fence', { 'idempotency-key': 'k-missing-fence' }],
    ['invalid_fence', { 'idempotency-key': 'k-bad-fence', 'x-execution-fence': 'abc' }],
    ['invalid_fence', { 'idempotency-key': 'k-neg-fence', 'x-execution-fence': '-5' }],
    ['invalid_fence', { 'idempotency-key': 'k-float-fence', 'x-execution-fence': '1.0' }],
    ['invalid_fence', { 'idempotency-key': 'k-huge-fence', 'x-execution-fence': '9223372036854775808' }],
    ['invalid_idempotency_key', { 'idempotency-key': 'k'.repeat(600), 'x-execution-fence': '1' }],
  ])('bad headers → 400 %s, no effect', async (error, headers) => {
    const before = calls;
    const res = await post({}, headers as Record<string, string>);
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({ error });
    expect(calls).toBe(before);
    expect(
      Number((await db.query<{ n: string }>('SELECT count(*) AS n FROM ratchet_receiver.effects WHERE key LIKE $1', ['k-%']))[0]?.n),
    ).toBe(0);
  });

  it('a body that is not JSON → 400 invalid_json, no effect', async () => {
    const key = newKey();
    const res = await post('{"summary": ', { 'idempotency-key': key, 'x-execution-fence': '1' });
    expect(res.status).toBe(400);
    expect(await res.json()).toEqual({ error: 'invalid_json' });
    expect(await caseCount(key)).toBe(0);
  });

  it('an oversized body (declared length) → 413, no effect', async () => {
    const key = newKey();
    const big = JSON.stringify({ summary: 'x'.repeat(1024 * 1024 + 10) });
    const before = calls;
    const res = await post(big, { 'idempotency-key': key, 'x-execution-fence': '1' });
    expect(res.status).toBe(413);
    expect(await res.json()).toMatchObject({ error: 'body_too_large', limit: 1024 * 1024 });
    expect(calls).toBe(before);
    expect(await caseCount(key)).toBe(0);
  });

  it('an oversized chunked body (no declared length) → 413, no effect', async () => {
    const key = newKey();
    const chunk = new TextEncoder().encode('x'.repeat(64 * 1024));
    let sent = 0;
    const stream = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (sent >= 20) return controller.close();
        sent += 1;
        controller.enqueue(chunk);
      },
    });
    const res = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-execution-fence': '1' },
      body: stream,
      duplex: 'half',
    } as RequestInit & { duplex: 'half' });
    expect(res.status).toBe(413);
    expect(await res.json()).toMatchObject({ error: 'body_too_large' });
    expect(await caseCount(key)).toBe(0);
  });

  it('a body just under the limit is accepted', async () => {
    const key = newKey();
    const summary = 'y'.repeat(1024 * 1024 - 100);
    const res = await post({ summary }, { 'idempotency-key': key, 'x-execution-fence': '1' });
    expect(res.status).toBe(201);
    expect(await caseCount(key)).toBe(1);
  });

  it('a repeated key with another body, path or method is 422 idempotency_key_reused, no second effect', async () => {
    const key = newKey();
    const headers = { 'idempotency-key': key, 'x-execution-fence': '5' };
    const first = await post({ summary: 'invoice 1' }, headers);
    expect(first.status).toBe(201);
    const before = calls;
    const other = await post({ summary: 'invoice 2' }, { ...headers, 'x-execution-fence': '6' });
    expect(other.status).toBe(422);
    expect(await other.json()).toEqual({ error: 'idempotency_key_reused' });
    const same1 = { headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ summary: 'invoice 1' }) };
    const otherPath = await fetch(`${url}?copy=1`, { method: 'POST', ...same1 });
    expect(otherPath.status).toBe(422);
    const otherMethod = await fetch(url, { method: 'PUT', ...same1 });
    expect(otherMethod.status).toBe(422);
    const same = await post({ summary: 'invoice 1' }, headers);
    expect(same.status).toBe(201);
    expect(same.headers.get('idempotent-replayed')).toBe('true');
    expect(calls).toBe(before);
    expect(await caseCount(key)).toBe(1);
    expect((await db.query('SELECT request_hash FROM ratchet_receiver.effects WHERE key = $1', [key]))[0]?.request_hash).toMatch(
      /^[0-9a-f]{64}$/,
    );
  });

  it.each([
    ['Idempotency-Key', { 'idempotency-key': ['dup-a', 'dup-b'], 'x-execution-fence': '1' }, 'invalid_idempotency_key'],
    ['X-Execution-Fence', { 'idempotency-key': 'dup-fence', 'x-execution-fence': ['1', '2'] }, 'invalid_fence'],
  ])('%s sent twice → 400, never joined into a new value; no effect', async (_name, headers, error) => {
    const before = calls;
    const res = await rawPost(JSON.stringify({ summary: 'dup' }), headers);
    expect(res.status).toBe(400);
    expect(JSON.parse(res.body)).toMatchObject({ error, message: expect.stringMatching(/more than once/) });
    expect(calls).toBe(before);
    expect(Number((await db.query<{ n: string }>("SELECT count(*) AS n FROM ratchet_receiver.effects WHERE key LIKE 'dup%'"))[0]?.n)).toBe(
      0,
    );
  });
});
