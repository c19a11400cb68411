import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiError } from '../../src/api/errors.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { counts, startApi, type Api } from './helpers.js';

/** POST /v1/runs on PostgreSQL through a real server on loopback: idempotency, errors, bad bodies, the OpenAPI document. */
let db: TestDatabase;
let api: Api;
beforeAll(async () => {
  db = await createTestDatabase('api_submit');
  api = await startApi({ databaseUrl: db.url, poolSize: 10, bodyLimit: 64 * 1024 });
});
afterAll(async () => {
  await api?.close();
  await db?.drop();
});

describe('POST /v1/runs', () => {
  it('50 concurrent submits with one key make one run: one 202, 49 times 200 with the same id', async () => {
    const results = await Promise.all(
      Array.from({ length: 50 }, () => api.client.submit('echo', { key: 'c50' }, { idempotencyKey: 'same-key-50' })),
    );
    const ids = new Set(results.map((r) => r.id));
    expect(ids.size).toBe(1);
    expect(results.filter((r) => r.status === 202 && r.created)).toHaveLength(1);
    expect(results.filter((r) => r.status === 200 && !r.created)).toHaveLength(49);
    const rows = await db.query('SELECT id FROM ratchet.runs WHERE idempotency_key = $1', ['same-key-50']);
    expect(rows).toHaveLength(1);
    expect((await db.query('SELECT count(*)::int AS n FROM ratchet.stages WHERE run_id = $1', [rows[0]!.id]))[0]!.n).toBe(1);
    expect(
      (await db.query("SELECT count(*)::int AS n FROM ratchet.events WHERE run_id = $1 AND type = 'run_submitted'", [rows[0]!.id]))[0]!.n,
    ).toBe(1);
  });

  it('the same key with another body is 409 idempotency_conflict, and writes nothing', async () => {
    const first = await api.http('/v1/runs', {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': 'k-409' },
      body: JSON.stringify({ workflow: 'echo', input: { key: 'a' } }),
    });
    expect(first.status).toBe(202);
    expect(first.headers.get('location')).toBe(`/v1/runs/${first.body.id}`);
    const before = await counts(api.ratchet);
    const other = await api.http('/v1/runs', {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': 'k-409' },
      body: JSON.stringify({ workflow: 'echo', input: { key: 'b' } }),
    });
    expect(other.status).toBe(409);
    expect(other.body).toEqual({
      error: {
        code: 'idempotency_conflict',
        message: expect.stringContaining('k-409'),
        path: 'Idempotency-Key',
        details: { runId: first.body.id },
      },
    });
    await expect(api.client.submit('echo', { key: 'c' }, { idempotencyKey: 'k-409' })).rejects.toMatchObject({
      code: 'idempotency_conflict',
      status: 409,
    });
    expect(await counts(api.ratchet)).toEqual(before);
  });

  it('a bad priority is 400 invalid_input on priority and writes nothing; a good one is kept and shown', async () => {
    const before = await counts(api.ratchet);
    for (const priority of [101, -101, 1.5, 'high', null]) {
      const res = await api.http('/v1/runs', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ workflow: 'echo', input: { key: 'p' }, priority }),
      });
      expect(res.status).toBe(400);
      expect(res.body.error).toMatchObject({ code: 'invalid_request', path: 'priority' });
    }
    await expect(api.client.submit('echo', { key: 'p' }, { priority: 500 })).rejects.toMatchObject({ status: 400 });
    expect(await counts(api.ratchet)).toEqual(before);
    const ok = await api.client.submit('echo', { key: 'p' }, { priority: 7 });
    expect(
      (
        await db.query(
          'SELECT r.priority AS r, s.priority AS s FROM ratchet.runs r JOIN ratchet.stages s ON s.run_id = r.id WHERE r.id = $1',
          [ok.id],
        )
      )[0],
    ).toEqual({ r: 7, s: 7 });
    const shown = await api.http(`/v1/runs/${ok.id}`, { headers: {} });
    expect(shown.body.priority).toBe(7);
  });

  it('an unknown workflow is 404 unknown_workflow; input the workflow refuses is 422 with the JSON path', async () => {
    const before = await counts(api.ratchet);
    const unknown = await api.http('/v1/runs', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ workflow: 'nope', input: {} }),
    });
    expect(unknown.status).toBe(404);
    expect(unknown.body.error).toMatchObject({ code: 'unknown_workflow', path: 'workflow' });
    const bad = await api.http('/v1/runs', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ workflow: 'echo', input: { key: 42 } }),
    });
    expect(bad.status).toBe(422);
    expect(bad.body.error).toMatchObject({ code: 'invalid_input', path: 'input.key' });
    const extra = await api.client.submit('echo', { key: 'x', nope: 1 }).catch((e: unknown) => e);
    expect(extra).toBeInstanceOf(ApiError);
    expect(extra).toMatchObject({ status: 422, code: 'invalid_input', path: 'input' });
    expect(await counts(api.ratchet)).toEqual(before);
  });

  describe('bad bodies: a 4xx with a JSON error path, and no row written', () => {
    const post = (body: string, headers: Record<string, string> = { 'content-type': 'application/json' }) =>
      api.http('/v1/runs', { method: 'POST', headers, body });
    const cases: [string, () => Promise<{ status: number; body: any }>, number, string, string][] = [
      ['not JSON', () => post('{"workflow": "echo", "input": {'), 400, 'invalid_json', '$'],
      ['not JSON at all', () => post('hello'), 400, 'invalid_json', '$'],
      ['a body that is not an object', () => post('[1,2]'), 400, 'invalid_request', '$'],
      ['workflow of the wrong type', () => post(JSON.stringify({ workflow: 7, input: {} })), 400, 'invalid_request', 'workflow'],
      [
        'deadline of the wrong type',
        () => post(JSON.stringify({ workflow: 'echo', input: { key: 'a' }, deadline: true })),
        400,
        'invalid_request',
        'deadline',
      ],
      [
        'a deadline that is no duration',
        () => post(JSON.stringify({ workflow: 'echo', input: { key: 'a' }, deadline: 'soon' })),
        422,
        'invalid_input',
        'deadline',
      ],
      ['no input', () => post(JSON.stringify({ workflow: 'echo' })), 400, 'invalid_request', 'input'],
      ['\\u0000 in the input', () => post('{"workflow":"echo","input":{"key":"a\\u0000b"}}'), 422, 'invalid_input', 'input.key'],
      [
        '\\u0000 in a key of the input',
        () => post('{"workflow":"echo","input":{"key":"a","b\\u0000":1}}'),
        422,
        'invalid_input',
        'input.b\u0000',
      ],
      ['\\u0000 in the workflow', () => post('{"workflow":"ec\\u0000ho","input":{}}'), 400, 'invalid_request', 'workflow'],
      [
        'an unknown field',
        () => post(JSON.stringify({ workflow: 'echo', input: { key: 'a' }, urgency: 9 })),
        400,
        'invalid_request',
        'urgency',
      ],
      [
        'an oversized body',
        () => post(JSON.stringify({ workflow: 'echo', input: { key: 'x'.repeat(200 * 1024) } })),
        413,
        'body_too_large',
        '$',
      ],
      [
        'an oversized body without a length (chunked)',
        () =>
          api.http('/v1/runs', {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            duplex: 'half',
            body: new ReadableStream({
              start(c) {
                for (let i = 0; i < 10; i++) c.enqueue(new TextEncoder().encode('x'.repeat(10_000)));
                c.close();
              },
            }),
          } as RequestInit),
        413,
        'body_too_large',
        '$',
      ],
      [
        'not application/json',
        () => post('workflow=echo', { 'content-type': 'application/x-www-form-urlencoded' }),
        415,
        'unsupported_media_type',
        '$',
      ],
      [
        'an Idempotency-Key too long',
        () =>
          post(JSON.stringify({ workflow: 'echo', input: { key: 'a' } }), {
            'content-type': 'application/json',
            'idempotency-key': 'k'.repeat(300),
          }),
        400,
        'invalid_request',
        'Idempotency-Key',
      ],
    ];
    for (const [name, send, status, code, path] of cases) {
      it(name, async () => {
        const before = await counts(api.ratchet);
        const res = await send();
        expect(res.status, JSON.stringify(res.body)).toBe(status);
        expect(res.body).toMatchObject({ error: { code, path, message: expect.any(String) } });
        expect(await counts(api.ratchet)).toEqual(before);
      });
    }
  });

  it('serves the OpenAPI document with every route and schema', async () => {
    const doc = await api.http('/v1/openapi.json');
    expect(doc.status).toBe(200);
    expect(Object.keys(doc.body.paths).sort()).toEqual([
      '/healthz',
      '/readyz',
      '/v1/approvals',
      '/v1/runs',
      '/v1/runs/{id}',
      '/v1/runs/{id}/cancel',
      '/v1/runs/{id}/events',
      '/v1/runs/{id}/explain',
      '/v1/runs/{id}/retry',
      '/v1/runs/{id}/signals/{name}',
      '/v1/runs/{id}/stages/{stageId}/approve',
      '/v1/runs/{id}/stages/{stageId}/reject',
      '/v1/schedules',
      '/v1/schedules/{name}',
    ]);
    expect(Object.keys(doc.body.paths['/v1/runs'].post.responses).sort()).toEqual([
      '200',
      '202',
      '400',
      '401',
      '404',
      '409',
      '413',
      '415',
      '422',
      '503',
    ]);
    expect(doc.body.components.schemas).toHaveProperty('Run');
    expect(doc.body.components.schemas).toHaveProperty('Explanation');
    expect(doc.body.components.schemas).toHaveProperty('Error');
    expect(doc.body.components.securitySchemes.bearer).toEqual({ type: 'http', scheme: 'bearer' });
  });
});
