import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { artefactPath, launchBrowser, type Browser } from '../helpers/browser.js';
import { insertQueuedStages } from '../helpers/stages.js';
import { callsOf } from '../api/fixtures.js';
import { startApi, TOKEN, until, type Api } from '../api/helpers.js';

/**
 * The dashboard in headless Chromium against a real server on PostgreSQL: sign in with the
 * token, page through a thousand runs, open a run whose first attempt lost its lease and was
 * reclaimed (both attempts on the timeline), cancel it with the button and watch the page
 * follow it to its end over the live stream, without a reload. Screenshots in test-artefacts/.
 */
let db: TestDatabase;
let api: Api;
let browser: Browser;
let reclaimedRun: string;
beforeAll(async () => {
  db = await createTestDatabase('dashboard_browser');
  api = await startApi({ databaseUrl: db.url, poolSize: 8, streamHeartbeatMs: 1000 });
  await insertQueuedStages(api.ratchet.store.db, 1000, 'bulk-class');
  // A worker claims the gate stage and dies: its lease (3 s) runs out, a live worker reclaims it.
  reclaimedRun = (await api.client.submit('gate', { key: 'dash-reclaim' })).id;
  const [dead] = await api.ratchet.store.claim({ owner: 'dead-worker-1', toolClass: 'long', limit: 1 });
  expect(dead?.runId).toBe(reclaimedRun);
  await new Promise((r) => setTimeout(r, 3300));
  await api.ratchet.worker({ classes: ['quick', 'long'], pollIntervalMs: 50 }).start();
  await until('the reclaim', async () => callsOf('gate', 'dash-reclaim').length > 0);
  browser = await launchBrowser();
}, 120_000);
afterAll(async () => {
  await browser?.close();
  await api?.close();
  await db?.drop();
});

describe('dashboard in a real browser', () => {
  it('sign in, a thousand runs paged, a reclaimed attempt on the timeline, cancel with the button and the page follows live to the end', async () => {
    const page = await browser.context.newPage();
    const failures: string[] = [];
    page.on('pageerror', (e) => failures.push(e.message));
    // The sign-in page answers 401 on purpose (not signed in, a wrong token); anything else is a failure.
    page.on('console', (m) => {
      if (m.type() === 'error' && !m.text().includes('status of 401')) failures.push(m.text());
    });

    // Not signed in: the sign-in page; a wrong token is refused.
    await page.goto(`${api.server.url}/`);
    await page.fill('input[name=token]', 'not-the-token-123');
    await page.click('button[type=submit]');
    await expect.poll(() => page.textContent('[role=alert]')).toContain('not accepted');
    await page.fill('input[name=token]', TOKEN);
    await page.click('button[type=submit]');
    await page.waitForSelector('table.runs');
    const cookies = await browser.context.cookies();
    expect(cookies.find((c) => c.name === 'ratchet_token')).toMatchObject({ httpOnly: true, sameSite: 'Strict' });

    // A thousand runs: 50 a page, the next page one click away.
    expect(await page.locator('table.runs tbody tr').count()).toBe(50);
    const t0 = Date.now();
    await page.click('a[rel=next]');
    await page.waitForURL(/cursor=/);
    const pageMs = Date.now() - t0;
    expect(await page.locator('table.runs tbody tr').count()).toBe(50);
    console.log(`dashboard: the second page of 1,002 runs loaded in ${pageMs} ms`);

    // Filter by state, open the reclaimed run.
    await page.selectOption('select[name=state]', 'running');
    await page.click('form.filters button');
    await page.click(`a[href="/runs/${reclaimedRun}"]`);
    await page.waitForSelector('#panel');
    const lane = page.locator('.lane[data-stage-seq="1"]');
    await expect.poll(() => lane.locator('.bar').count()).toBe(2);
    expect(await lane.locator('.bar[data-attempt="1"]').getAttribute('data-outcome')).toBe('lease_lost');
    expect(await lane.locator('.bar[data-attempt="2"]').getAttribute('data-outcome')).toBe('running');
    expect(await lane.locator('.bar[data-attempt="2"]').getAttribute('class')).toContain('reclaimed');
    expect(await lane.locator('.mark.m-reclaim').count()).toBe(1);
    await expect.poll(() => page.textContent('#live')).toBe('live');
    expect(await page.textContent('#panel .explain')).toContain('running_healthy');
    await page.screenshot({ path: artefactPath('dashboard-reclaimed.png'), fullPage: true });

    // Cancel with the button: no reload; the stream brings the end.
    await page.evaluate(() => {
      (window as unknown as { marker: number }).marker = 42;
    });
    await page.click('form[data-action=cancel] button');
    await expect.poll(() => page.textContent('#run-state'), { timeout: 15_000 }).toBe('cancelled');
    await expect.poll(() => page.locator('#events tr', { hasText: 'run_cancelled' }).count()).toBe(1);
    await expect.poll(() => page.textContent('#live')).toBe('finished');
    await expect.poll(() => lane.locator('.bar[data-attempt="2"]').getAttribute('data-outcome')).toBe('cancelled');
    expect(await page.evaluate(() => (window as unknown as { marker?: number }).marker)).toBe(42); // the same page: updated live
    expect(await page.locator('form[data-action=cancel]').count()).toBe(0);
    await page.screenshot({ path: artefactPath('dashboard-cancelled.png'), fullPage: true });
    expect((await api.client.get(reclaimedRun)).state).toBe('cancelled');
    expect(failures).toEqual([]);
  }, 120_000);

  it('buttons refuse a request without the CSRF token or from another origin; pages and streams refuse a missing cookie', async () => {
    const cookie = `ratchet_token=${TOKEN}`;
    const { id } = await api.client.submit('gate', { key: 'dash-csrf' });
    const post = (headers: Record<string, string>) =>
      fetch(`${api.server.url}/runs/${id}/cancel`, { method: 'POST', headers: { accept: 'application/json', ...headers } });
    expect((await post({ cookie })).status).toBe(403);
    expect((await post({ cookie, 'x-csrf-token': 'forged' })).status).toBe(403);
    const html = await (await fetch(`${api.server.url}/runs/${id}`, { headers: { cookie, accept: 'text/html' } })).text();
    const csrf = /name="csrf-token" content="([^"]+)"/.exec(html)![1]!;
    expect((await post({ cookie, 'x-csrf-token': csrf, origin: 'http://evil.example' })).status).toBe(403);
    expect((await api.client.get(id)).state).not.toBe('cancelled');
    expect((await fetch(`${api.server.url}/runs/${id}`, { headers: { accept: 'text/html' } })).status).toBe(401);
    expect((await fetch(`${api.server.url}/runs/${id}/stream`)).status).toBe(401);
    const ok = await post({ cookie, 'x-csrf-token': csrf });
    expect(ok.status).toBe(200);
    expect((await api.client.get(id)).state).toBe('cancelled');
    const res = await fetch(`${api.server.url}/`, { headers: { cookie, accept: 'text/html' } });
    expect(res.headers.get('content-security-policy')).toContain("script-src 'self'");
  });
});
