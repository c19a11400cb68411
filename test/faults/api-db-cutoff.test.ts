import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startTcpProxy, type TcpProxy } from '../helpers/tcp-proxy.js';
import { startApi, type Api } from '../api/helpers.js';

/**
 * PostgreSQL cut off from the API server by a TCP proxy of our own (never the shared server):
 * every route that needs the database answers 503 with Retry-After — never a 500, never a
 * false success — and when the link returns nothing is half-written: the submit that got a
 * 503 is simply made again with the same key.
 */
let db: TestDatabase;
let proxy: TcpProxy;
let api: Api;
beforeAll(async () => {
  db = await createTestDatabase('api_cutoff');
  const u = new URL(db.url);
  proxy = await startTcpProxy({ target: { host: u.hostname, port: Number(u.port || 5432) } });
  api = await startApi({ databaseUrl: proxy.url(db.url), poolSize: 3, queryTimeoutMs: 1000, connectionTimeoutMs: 1000 });
});
afterAll(async () => {
  await api?.close();
  await proxy?.close();
  await db?.drop();
});

const json = { 'content-type': 'application/json' };
const submitBody = (key: string) => JSON.stringify({ workflow: 'orphan', input: { key } });

async function expect503(res: { status: number; headers: Headers; body: any }, what: string) {
  expect(res.status, `${what}: ${JSON.stringify(res.body)}`).toBe(503);
  expect(res.headers.get('retry-after'), what).toBe('2');
  expect(res.body, what).toMatchObject({ error: { code: 'database_unavailable', message: expect.any(String) } });
}

describe('the database cut off', () => {
  it('503 with Retry-After on every route that needs it (black-holed, then reset); nothing half-written when it returns', async () => {
    const before = await api.http('/v1/runs', {
      method: 'POST',
      headers: { ...json, 'idempotency-key': 'cut-before' },
      body: submitBody('before'),
    });
    expect(before.status).toBe(202);
    const id = before.body.id as string;

    for (const mode of ['blackhole', 'reset'] as const) {
      proxy.setMode(mode);
      const t0 = Date.now();
      await expect503(
        await api.http('/v1/runs', { method: 'POST', headers: { ...json, 'idempotency-key': 'cut-during' }, body: submitBody('during') }),
        `${mode} submit`,
      );
      await expect503(await api.http(`/v1/runs/${id}`), `${mode} get`);
      await expect503(await api.http('/v1/runs'), `${mode} list`);
      await expect503(await api.http(`/v1/runs/${id}/events`), `${mode} events`);
      await expect503(await api.http(`/v1/runs/${id}/explain`), `${mode} explain`);
      await expect503(await api.http(`/v1/runs/${id}/cancel`, { method: 'POST' }), `${mode} cancel`);
      await expect503(await api.http(`/v1/runs/${id}/retry`, { method: 'POST' }), `${mode} retry`);
      const notReady = await api.http('/readyz', { token: null });
      expect(notReady).toMatchObject({ status: 503, body: { ok: false, database: 'down' } });
      expect(notReady.headers.get('retry-after')).toBe('2');
      expect((await api.http('/healthz', { token: null })).status).toBe(200);
      expect(Date.now() - t0).toBeLessThan(30_000); // bounded by the client-side query and connection timeouts
      // The client sees a typed error, not a success.
      await expect(api.client.submit('orphan', { key: 'during' }, { idempotencyKey: 'cut-during' })).rejects.toMatchObject({
        code: 'database_unavailable',
        status: 503,
        retryAfterMs: 2000,
      });
      // Checked behind the proxy's back: nothing was written.
      expect(await db.query('SELECT id FROM ratchet.runs WHERE idempotency_key = $1', ['cut-during'])).toEqual([]);
    }

    // The link returns (reset first: it frees the PostgreSQL backends the partition left behind).
    proxy.setMode('reset');
    proxy.setMode('pass');
    await new Promise((r) => setTimeout(r, 200));
    let ready = await api.http('/readyz', { token: null });
    for (let i = 0; i < 20 && ready.status !== 200; i++) ready = await api.http('/readyz', { token: null }); // stale pooled connections fail once each
    expect(ready).toMatchObject({ status: 200, body: { ok: true, database: 'up' } });

    const again = await api.http('/v1/runs', {
      method: 'POST',
      headers: { ...json, 'idempotency-key': 'cut-during' },
      body: submitBody('during'),
    });
    expect(again.status, JSON.stringify(again.body)).toBe(202); // created now: the earlier attempts left nothing behind
    const runs = await db.query('SELECT id FROM ratchet.runs WHERE idempotency_key = $1', ['cut-during']);
    expect(runs).toEqual([{ id: again.body.id }]);
    expect((await db.query('SELECT count(*)::int AS n FROM ratchet.stages WHERE run_id = $1', [again.body.id]))[0]!.n).toBe(1);
    expect(
      (await db.query("SELECT count(*)::int AS n FROM ratchet.events WHERE run_id = $1 AND type = 'run_submitted'", [again.body.id]))[0]!.n,
    ).toBe(1);
    expect(
      (
        await db.query(
          'SELECT count(*)::int AS n FROM ratchet.events e WHERE NOT EXISTS (SELECT 1 FROM ratchet.runs r WHERE r.id = e.run_id)',
        )
      )[0]!.n,
    ).toBe(0);
    expect((await db.query('SELECT count(*)::int AS n FROM ratchet.runs'))[0]!.n).toBe(2);
    // The cancel and retry that got a 503 changed nothing.
    expect((await api.client.get(id)).state).toBe('queued');
  }, 120_000);
});
