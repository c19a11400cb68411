import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTokenCheck, isLoopback } from '../../src/api/auth.js';
import { createServer } from '../../src/api/server.js';
import { InvalidInputError } from '../../src/errors.js';
import { counts, startApi, TOKEN, type Api } from './helpers.js';

/** Bearer auth on every route but health, on a real server (embedded store); listening beyond loopback needs a token. */
let api: Api;
let runId: string;
beforeAll(async () => {
  api = await startApi({ tokens: [TOKEN, 'second-token-for-rotation'] });
  runId = (await api.client.submit('orphan', { key: 'auth' })).id;
});
afterAll(async () => {
  await api?.close();
});

const protectedRoutes = (): [string, string, string?][] => [
  ['POST', '/v1/runs', JSON.stringify({ workflow: 'echo', input: { key: 'sneaky' } })],
  ['GET', '/v1/runs'],
  ['GET', `/v1/runs/${runId}`],
  ['GET', `/v1/runs/${runId}/events`],
  ['GET', `/v1/runs/${runId}/explain`],
  ['POST', `/v1/runs/${runId}/cancel`],
  ['POST', `/v1/runs/${runId}/retry`],
  ['GET', '/v1/openapi.json'],
  ['GET', '/v1/metrics'],
  ['GET', '/v1/no-such-route'],
];

describe('auth', () => {
  for (const [label, token] of [
    ['missing', null],
    ['wrong', 'wrong-token-0123456789'],
    ['a prefix of the right one', TOKEN.slice(0, -1)],
    ['the right one plus more', `${TOKEN}x`],
  ] as const) {
    it(`a ${label} token is 401 on every protected route, and nothing changes`, async () => {
      const before = await counts(api.ratchet);
      for (const [method, path, body] of protectedRoutes()) {
        const res = await api.http(path, { method, token, headers: body ? { 'content-type': 'application/json' } : {}, body });
        expect(res.status, `${method} ${path}`).toBe(401);
        expect(res.body).toMatchObject({ error: { code: 'unauthorized' } });
        expect(res.headers.get('www-authenticate')).toMatch(/^Bearer/);
      }
      expect(await counts(api.ratchet)).toEqual(before);
      expect((await api.ratchet.getRun(runId))!.state).toBe('queued'); // not cancelled
    });
  }

  it('a scheme other than Bearer is refused', async () => {
    const res = await api.http('/v1/runs', {
      token: null,
      headers: { authorization: `Basic ${Buffer.from(`u:${TOKEN}`).toString('base64')}` },
    });
    expect(res.status).toBe(401);
  });

  it('every configured token works (rotation); health needs none', async () => {
    expect((await api.http(`/v1/runs/${runId}`)).status).toBe(200);
    expect((await api.http(`/v1/runs/${runId}`, { token: 'second-token-for-rotation' })).status).toBe(200);
    expect(await api.http('/healthz', { token: null })).toMatchObject({ status: 200, body: { ok: true } });
    expect(await api.http('/readyz', { token: null })).toMatchObject({ status: 200, body: { ok: true, database: 'up' } });
  });

  it('the client with a wrong token gets ApiError unauthorized', async () => {
    const { createClient } = await import('../../src/client/index.js');
    const c = createClient({ baseUrl: api.server.url, token: 'nope-nope-nope' });
    await expect(c.get(runId)).rejects.toMatchObject({ name: 'ApiError', code: 'unauthorized', status: 401 });
  });

  it('the server refuses a non-loopback address without a token, and listens on one with a token', async () => {
    for (const host of ['0.0.0.0', '::', '192.168.1.10', 'example.org']) {
      await expect(createServer({ ratchet: api.ratchet, host, port: 0 })).rejects.toBeInstanceOf(InvalidInputError);
      await expect(createServer({ ratchet: api.ratchet, host, port: 0, tokens: [] })).rejects.toMatchObject({
        code: 'invalid_input',
        details: { reason: 'token_required' },
      });
    }
    const open = await createServer({ ratchet: api.ratchet, host: '0.0.0.0', port: 0, tokens: [TOKEN] });
    try {
      const res = await fetch(`http://127.0.0.1:${open.port}/v1/runs`);
      expect(res.status).toBe(401);
    } finally {
      await open.close();
    }
    await expect(createServer({ ratchet: api.ratchet, port: 0, tokens: ['short'] })).rejects.toBeInstanceOf(InvalidInputError);
  });

  it('token checks and loopback detection', () => {
    const check = createTokenCheck(['abc-def-ghi']);
    expect(check('Bearer abc-def-ghi')).toBe(true);
    expect(check('bearer abc-def-ghi')).toBe(true);
    expect(check('Bearer abc-def-gh')).toBe(false);
    expect(check('abc-def-ghi')).toBe(false);
    expect(check(undefined)).toBe(false);
    expect(createTokenCheck([])('Bearer ')).toBe(false);
    expect(['127.0.0.1', '127.1.2.3', '::1', '[::1]', 'localhost'].every(isLoopback)).toBe(true);
    expect(['0.0.0.0', '::', '10.0.0.1', 'example.org', '::ffff:10.0.0.1'].some(isLoopback)).toBe(false);
  });
});

describe('metrics', () => {
  it('serves Prometheus metrics behind the bearer token', async () => {
    const res = await api.http('/v1/metrics', { method: 'GET', token: TOKEN });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/text\/plain/);
    expect(String(res.body)).toContain('ratchet_stages_claimed_total');
  });
});
