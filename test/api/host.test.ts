import { request } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isLoopbackHost } from '../../src/api/auth.js';
import { startApi, type Api } from './helpers.js';

/** DNS rebinding: with no tokens, only requests addressed to a loopback name are answered. */
let api: Api;
beforeAll(async () => {
  api = await startApi({ tokens: [] });
});
afterAll(async () => {
  await api?.close();
});

function get(path: string, host: string | null, server = api): Promise<{ status: number; body: string }> {
  const { port } = new URL(server.server.url);
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, setHost: host !== null, headers: host === null ? {} : { host } }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode!, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe('no tokens: the Host header', () => {
  it('refuses a rebound name for the API and the dashboard, answers loopback names', async () => {
    const port = new URL(api.server.url).port;
    for (const path of ['/v1/runs', '/', '/login']) {
      const bad = await get(path, `evil.example:${port}`);
      expect(bad.status, path).toBe(403);
      expect(JSON.parse(bad.body)).toMatchObject({ error: { code: 'forbidden_host' } });
    }
    expect((await get('/v1/runs', `localhost:${port}`)).status).toBe(200);
    expect((await get('/v1/runs', `127.0.0.1:${port}`)).status).toBe(200);
    expect((await get('/v1/runs', '[::1]')).status).toBe(200);
    expect((await get('/login', `localhost:${port}`)).status).toBe(200);
    expect((await get('/healthz', 'evil.example')).status).toBe(200);
  });

  it('GET / of the dashboard: every loopback form of Host is answered, with and without tokens (no 400 from the adapter)', async () => {
    const withTokens = await startApi({ tokens: ['host-test-token-0123456789'] });
    try {
      for (const [server, expected] of [
        [api, 200],
        [withTokens, 401], // the sign-in page
      ] as const) {
        const port = new URL(server.server.url).port;
        const hosts = [
          `127.0.0.1:${port}`,
          `localhost:${port}`,
          `[::1]:${port}`,
          'localhost',
          '127.0.0.1',
          '[::1]',
          `LOCALHOST:${port}`,
          `LocalHost`,
          `[0:0:0:0:0:0:0:1]:${port}`,
          `127.000.000.001:${port}`,
        ];
        for (const host of hosts)
          expect((await get('/', host, server)).status, `${host} (tokens: ${server === withTokens})`).toBe(expected);
        // No Host at all: HTTP/1.1 requires one, and Node's server answers 400 before any route (RFC 9112 §3.2).
        expect((await get('/', null, server)).status).toBe(400);
      }
      // A rebound name in capitals is still refused without tokens (403, not let through by the rewrite).
      expect((await get('/', `EVIL.example:${new URL(api.server.url).port}`)).status).toBe(403);
    } finally {
      await withTokens.close();
    }
  });

  it('isLoopbackHost', () => {
    expect(['localhost', 'localhost:7700', '127.0.0.1:1', '[::1]:7700', '[::1]'].every(isLoopbackHost)).toBe(true);
    expect(['', '127.0.0.1.evil.example', 'localhost.evil.example:80', '0.0.0.0', '[::]', '10.0.0.1:80'].some(isLoopbackHost)).toBe(false);
    expect(isLoopbackHost(undefined)).toBe(false);
  });
});
