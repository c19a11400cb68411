import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_BODY_LIMIT } from '../../src/api/server.js';
import { startApi, TOKEN, type Api } from '../api/helpers.js';

/**
 * Login CSRF: a page elsewhere posting the sign-in form would sign this browser in with a token
 * of its choosing (then the operator's actions are recorded as that token's). There is no session
 * yet for a CSRF token, so the sign-in refuses what the browser says came from elsewhere: an
 * Origin that is not this server (or `null`), Sec-Fetch-Site cross-site or same-site.
 */
let api: Api;
beforeAll(async () => {
  api = await startApi();
});
afterAll(async () => {
  await api?.close();
});

const login = (headers: Record<string, string>, token = TOKEN) =>
  fetch(`${api.server.url}/login`, {
    method: 'POST',
    redirect: 'manual',
    headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'text/html', ...headers },
    body: new URLSearchParams({ token }),
  });

describe('POST /login', () => {
  it('refuses a sign-in posted from another site, sets no cookie; accepts one from this server', async () => {
    const here = new URL(api.server.url).origin;
    const elsewhere: Record<string, string>[] = [
      { origin: 'http://evil.example' },
      { origin: 'null' }, // a cross-site form under Referrer-Policy: no-referrer
      { 'sec-fetch-site': 'cross-site' },
      { 'sec-fetch-site': 'same-site' }, // a sibling subdomain
      { origin: here, 'sec-fetch-site': 'cross-site' },
    ];
    for (const headers of elsewhere) {
      const res = await login(headers);
      expect(res.status, JSON.stringify(headers)).toBe(403);
      expect(res.headers.get('set-cookie'), JSON.stringify(headers)).toBeNull();
      expect(await res.text()).toContain('did not come from this server');
    }
    const ours: Record<string, string>[] = [{ origin: here, 'sec-fetch-site': 'same-origin' }, { 'sec-fetch-site': 'none' }, {}];
    for (const headers of ours) {
      const res = await login(headers);
      expect(res.status, JSON.stringify(headers)).toBe(303);
      expect(res.headers.get('set-cookie')).toMatch(/^ratchet_token=.*HttpOnly.*SameSite=Strict/i);
    }
    expect((await login({ origin: here }, 'wrong-token-0123456789')).status).toBe(401);
  });

  it('the buttons too: Sec-Fetch-Site cross-site is refused even with the right CSRF token', async () => {
    const cookie = `ratchet_token=${TOKEN}`;
    const { id } = await api.client.submit('gate', { key: 'login-csrf' });
    const html = await (await fetch(`${api.server.url}/runs/${id}`, { headers: { cookie, accept: 'text/html' } })).text();
    const csrf = /name="csrf-token" content="([^"]+)"/.exec(html)![1]!;
    const post = (headers: Record<string, string>) =>
      fetch(`${api.server.url}/runs/${id}/cancel`, {
        method: 'POST',
        headers: { accept: 'application/json', cookie, 'x-csrf-token': csrf, ...headers },
      });
    expect((await post({ 'sec-fetch-site': 'cross-site' })).status).toBe(403);
    expect((await post({ 'sec-fetch-site': 'same-origin' })).status).toBe(200);
  });
});

describe('the body limit on the dashboard', () => {
  const form = (bytes: number, token = TOKEN) => {
    const head = `token=${encodeURIComponent(token)}&pad=`;
    return head + 'x'.repeat(bytes - head.length);
  };
  const postLogin = (body: BodyInit, extra: RequestInit = {}) =>
    fetch(`${api.server.url}/login`, {
      method: 'POST',
      redirect: 'manual',
      headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'text/html' },
      body,
      ...extra,
    });

  it("POST /login past the API's limit is 413, signs nobody in; up to the limit it is read as before", async () => {
    const over = await postLogin(form(DEFAULT_BODY_LIMIT + 1024));
    expect(over.status).toBe(413);
    expect(over.headers.get('set-cookie')).toBeNull();
    expect(await over.json()).toMatchObject({ error: { code: 'body_too_large', details: { limit: DEFAULT_BODY_LIMIT } } });
    // Without a length (chunked): cut off at the limit all the same.
    const chunk = new TextEncoder().encode('x'.repeat(64 * 1024));
    const chunked = await postLogin(
      new ReadableStream({
        start(c) {
          c.enqueue(new TextEncoder().encode(`token=${TOKEN}&pad=`));
          for (let i = 0; i < DEFAULT_BODY_LIMIT / chunk.length + 1; i++) c.enqueue(chunk);
          c.close();
        },
      }),
      { duplex: 'half' } as RequestInit,
    );
    expect(chunked.status).toBe(413);
    expect(chunked.headers.get('set-cookie')).toBeNull();
    const under = await postLogin(form(DEFAULT_BODY_LIMIT - 1024));
    expect(under.status).toBe(303);
  });

  it('the buttons too: a signed-in POST past the limit is 413, the run untouched', async () => {
    const cookie = `ratchet_token=${TOKEN}`;
    const { id } = await api.client.submit('gate', { key: 'login-body-limit' });
    const html = await (await fetch(`${api.server.url}/runs/${id}`, { headers: { cookie, accept: 'text/html' } })).text();
    const csrf = /name="csrf-token" content="([^"]+)"/.exec(html)![1]!;
    const res = await fetch(`${api.server.url}/runs/${id}/cancel`, {
      method: 'POST',
      headers: { accept: 'application/json', cookie, 'content-type': 'application/x-www-form-urlencoded' },
      body: `csrf=${encodeURIComponent(csrf)}&pad=${'x'.repeat(DEFAULT_BODY_LIMIT)}`,
    });
    expect(res.status).toBe(413);
    expect((await api.client.get(id)).state).not.toBe('cancelled');
  });
});
