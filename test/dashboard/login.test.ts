import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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
