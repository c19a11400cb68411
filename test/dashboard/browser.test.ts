import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { artefactPath, launchBrowser, type Browser } from '../helpers/browser.js';
import { insertQueuedStages } from '../helpers/stages.js';
import { apiWorkflows, owe } from '../api/fixtures.js';
import { startApi, TOKEN, until, type Api } from '../api/helpers.js';
import { waitWorkflows } from '../api/waits-fixtures.js';

/**
 * The dashboard in headless Chromium against a real server on PostgreSQL: sign in with the
 * token, page through a thousand runs, open a run whose first attempt lost its lease and was
 * reclaimed (both attempts on the timeline), cancel it with the button and watch the page
 * follow it to its end over the live stream, without a reload; a fan-out's parallel stages in
 * their own lanes; approve a stage awaiting approval with its button and watch the run finish
 * live (a real gate: the worker's claim of a tool with `approval: true` asks); reject another with a
 * reason. Screenshots in test-artefacts/.
 */
const par = defineToolClass({ name: 'dash-par', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '10s', maxDuration: '30s' });
const nap = (name: string) =>
  defineTool({
    name,
    description: 'naps',
    class: par,
    input: z.unknown(),
    output: z.object({ ok: z.string() }),
    run: async () => {
      await new Promise((r) => setTimeout(r, 400));
      return { ok: name };
    },
  });
/**
 * The reclaimed run's one stage: it holds until cancelled. Its own class, so that a loaded machine (CI runs
 * other test files beside this one) cannot end the run under the test: a 500 ms heartbeat on a 3 s lease, and
 * 10 attempts, so a live worker that loses its lease again is reclaimed again (the test reads every
 * attempt) instead of failing the run after its third attempt, which took it off the 'running' filter.
 */
const held = defineToolClass({
  name: 'dash-held',
  lease: '3s',
  heartbeat: '500ms',
  jitter: '100ms',
  timeout: '60s',
  maxDuration: '120s',
  retry: { maxAttempts: 10 },
});
const heldCalls: number[] = [];
const holdTool = defineTool({
  name: 'dash-hold',
  description: 'holds until its signal aborts',
  class: held,
  input: z.unknown(),
  output: z.object({}),
  run: async (_i, ctx) => {
    heldCalls.push(ctx.attempt);
    await new Promise((_r, reject) => ctx.signal.addEventListener('abort', () => reject(ctx.signal.reason), { once: true }));
    return {};
  },
});
const hold = defineWorkflow({ name: 'dash-hold', input: z.unknown(), steps: [{ tool: holdTool }] });
const publish = defineWorkflow({ name: 'dash-publish', input: z.unknown(), steps: [{ tool: nap('post') }] });
/** Two branches at once, their join, then a child run. */
const fanout = defineWorkflow({
  name: 'dash-fanout',
  input: z.object({}),
  steps: [
    { tool: nap('left') },
    { tool: nap('right'), after: [] },
    { tool: nap('join'), after: ['left', 'right'] },
    { name: 'publish', workflow: 'dash-publish', input: () => ({}) },
  ],
});

let db: TestDatabase;
let api: Api;
let browser: Browser;
let reclaimedRun: string;
/** Runs of `gated` whose first stage (create_case, approval: true) awaits a person. */
let toApprove: { id: string; stageIds: string[] };
let toReject: { id: string; stageIds: string[] };

/** A run of `gated` submitted through the API: a worker claims create_case (approval: true) and the stage waits for a person. */
async function awaitingApproval(invoiceId: string) {
  const { id } = await api.client.submit('gated', { invoiceId, amount: 120 });
  const stageIds = await until(`run ${id} to await approval`, async () => {
    const run = await api.ratchet.store.getRun(id);
    return run?.stages[0]?.state === 'awaiting_approval' ? run.stages.map((s) => s.id) : null;
  });
  return { id, stageIds };
}

beforeAll(async () => {
  db = await createTestDatabase('dashboard_browser');
  api = await startApi({
    databaseUrl: db.url,
    poolSize: 8,
    streamHeartbeatMs: 1000,
    workflows: [...apiWorkflows, ...waitWorkflows, fanout, publish, hold],
  });
  await insertQueuedStages(api.ratchet.store.db, 1000, 'bulk-class');
  // A worker claims the gate stage and dies: its lease (3 s) runs out, a live worker reclaims it.
  reclaimedRun = (await api.client.submit('dash-hold', {})).id;
  const [dead] = await api.ratchet.store.claim({ owner: 'dead-worker-1', toolClass: 'dash-held', limit: 1 });
  expect(dead?.runId).toBe(reclaimedRun);
  await new Promise((r) => setTimeout(r, 3300));
  await api.ratchet
    .worker({ classes: ['quick', 'long', 'wio', 'dash-par', 'dash-held', '$control'], pollIntervalMs: 50, concurrency: 4 })
    .start();
  await until('the reclaim', async () => heldCalls.length > 0);
  // Two real approval gates: the worker's claim of create_case asks a person.
  toApprove = await awaitingApproval('inv-approve');
  toReject = await awaitingApproval('inv-reject');
  browser = await launchBrowser();
}, 120_000);
afterAll(async () => {
  await browser?.close();
  await api?.close();
  await db?.drop();
});

/** A page of the dashboard, signed in with the token (the cookie stays in the browser's context). */
async function openSignedIn(path: string) {
  const page = await browser.context.newPage();
  await page.goto(`${api.server.url}${path}`);
  if ((await page.locator('input[name=token]').count()) > 0) {
    await page.fill('input[name=token]', TOKEN);
    await page.click('button[type=submit]');
    await page.waitForSelector('table.runs');
    await page.goto(`${api.server.url}${path}`);
  }
  return page;
}

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

    // What awaits a person: listed above the runs, and the list's own filter.
    expect(await page.locator('section.approvals tr[data-run-id]').count()).toBe(2);
    await page.selectOption('select[name=state]', 'awaiting_approval');
    await page.click('form.filters button');
    await page.waitForSelector('table.approvals-list');
    expect(await page.locator(`table.approvals-list tr[data-stage-id="${toApprove.stageIds[0]}"]`).count()).toBe(1);
    await page.goto(`${api.server.url}/`);

    // A thousand runs: 50 a page, the next page one click away.
    expect(await page.locator('table.runs tbody tr').count()).toBe(50);
    const t0 = Date.now();
    await page.click('a[rel=next]');
    await page.waitForURL(/cursor=/);
    const pageMs = Date.now() - t0;
    expect(await page.locator('table.runs tbody tr').count()).toBe(50);
    console.log(`dashboard: the second page of 1,002 runs loaded in ${pageMs} ms`);

    // Filter by state, open the reclaimed run (still running: said here, rather than as a missing link).
    expect((await api.client.get(reclaimedRun)).state).toBe('running');
    await page.selectOption('select[name=state]', 'running');
    await page.click('form.filters button');
    await page.waitForURL(/state=running/);
    const link = page.locator(`a[href="/runs/${reclaimedRun}"]`);
    // If the link is missing, say what the page showed instead of a bare click timeout.
    await expect
      .poll(() => link.count(), { timeout: 15_000, message: 'the reclaimed run on the running filter' })
      .toBe(1)
      .catch(async (e) => {
        throw new Error(`${(e as Error).message}\nthe page showed: ${(await page.textContent('body'))?.slice(0, 2000)}`);
      });
    await link.click();
    await page.waitForSelector('#panel');
    const lane = page.locator('.lane[data-stage-seq="1"]');
    // Two attempts: the dead worker's, lost, and the live worker's reclaim. On a loaded machine the live worker
    // may lose its 3 s lease too (reclaimed again: lease_lost) or find its heartbeat unanswered in time (the tool
    // is aborted and the attempt retried: retried); every attempt but the last is one of those, each reclaim
    // marked once, and the last one runs.
    // Between a retry and its next claim the lane's last bar is the retried one: wait (reading the page again) for a
    // running last attempt.
    const lastOutcome = async () => {
      const n = await lane.locator('.bar').count();
      return n >= 2 ? lane.locator(`.bar[data-attempt="${n}"]`).getAttribute('data-outcome') : null;
    };
    await expect
      .poll(
        async () => {
          const o = await lastOutcome();
          if (o !== 'running') {
            await page.reload();
            await page.waitForSelector('#panel');
          }
          return o;
        },
        { timeout: 20_000 },
      )
      .toBe('running');
    const bars = await lane.locator('.bar').count();
    const outcomes: string[] = [];
    for (let n = 1; n <= bars; n++) outcomes.push((await lane.locator(`.bar[data-attempt="${n}"]`).getAttribute('data-outcome')) ?? '');
    expect(outcomes[0]).toBe('lease_lost');
    expect(await lane.locator('.bar[data-attempt="2"]').getAttribute('class')).toContain('reclaimed');
    for (const o of outcomes.slice(1, -1)) expect(['lease_lost', 'retried']).toContain(o);
    const last = lane.locator(`.bar[data-attempt="${bars}"]`);
    expect(outcomes.at(-1)).toBe('running');
    expect(await lane.locator('.mark.m-reclaim').count()).toBe(outcomes.filter((o) => o === 'lease_lost').length);
    await expect.poll(() => page.textContent('#live')).toBe('live');
    expect(await page.textContent('#panel .explain')).toContain('running_healthy');
    await page.screenshot({ path: artefactPath('dashboard-reclaimed.png'), fullPage: true });

    // Cancel with the button: no reload; the stream brings the end.
    await page.evaluate(() => {
      (window as unknown as { marker: number }).marker = 42;
    });
    await page.click('form[data-action=cancel] button');
    await expect.poll(() => page.textContent('#run-state'), { timeout: 15_000 }).toBe('cancelled');
    // Polled long: a transaction elsewhere in the cluster holds every stream back while it runs.
    await expect.poll(() => page.locator('#events tr', { hasText: 'run_cancelled' }).count(), { timeout: 20_000 }).toBe(1);
    await expect.poll(() => page.textContent('#live')).toBe('finished');
    await expect.poll(() => last.getAttribute('data-outcome')).toBe('cancelled');
    expect(await page.evaluate(() => (window as unknown as { marker?: number }).marker)).toBe(42); // the same page: updated live
    expect(await page.locator('form[data-action=cancel]').count()).toBe(0);
    await page.screenshot({ path: artefactPath('dashboard-cancelled.png'), fullPage: true });
    expect((await api.client.get(reclaimedRun)).state).toBe('cancelled');
    expect(failures).toEqual([]);
  }, 120_000);

  it('parallel stages in their own lanes: a fan-out of two and their join', async () => {
    const { id } = await api.client.submit('dash-fanout', {});
    await until('the fan-out to end', async () => (await api.client.get(id)).state === 'succeeded');
    const page = await openSignedIn(`/runs/${id}`);
    const lanes = page.locator('.timeline .lane');
    expect(await lanes.count()).toBe(4);
    // The page resumes the stream after its last event: nothing to send unless a transaction elsewhere held
    // some of the run's events back as the page rendered (then they come on the stream, and a redraw).
    await expect.poll(() => page.textContent('#live'), { timeout: 20_000 }).toBe('finished');
    const box = async (seq: number) => {
      const bar = page.locator(`.lane[data-stage-seq="${seq}"] .bar[data-attempt="1"]`);
      // Polled: a transaction elsewhere in the cluster may hold the stream back as the page renders; its events come on the stream, and a redraw.
      await expect.poll(() => bar.getAttribute('data-outcome')).toBe('succeeded');
      let b = await bar.boundingBox();
      for (let i = 0; b === null && i < 20; i++) b = await page.waitForTimeout(100).then(() => bar.boundingBox());
      return b!;
    };
    const [left, right, join] = [await box(1), await box(2), await box(3)];
    // Each in its own row; the two branches overlap in time, the join starts after both.
    expect(new Set([left.y, right.y, join.y]).size).toBe(3);
    expect(left.x < right.x + right.width && right.x < left.x + left.width).toBe(true);
    expect(join.x).toBeGreaterThanOrEqual(Math.max(left.x + left.width, right.x + right.width) - 2);
    expect(await page.textContent('.lane[data-stage-seq="3"] .lane-label')).toContain('after 1, 2');
    // The child-run stage: handed back to wait for its child, the wait drawn, a link to the child's page.
    const childLane = page.locator('.lane[data-stage-seq="4"]');
    await expect.poll(() => childLane.locator('.wait[data-wait-kind="child"]').count()).toBe(1);
    expect(await childLane.locator('.bar').first().getAttribute('data-outcome')).toBe('waited');
    await page.screenshot({ path: artefactPath('dashboard-fanout.png'), fullPage: true });
    const child = (await api.client.get(id)).children?.[0];
    expect(child?.workflow).toBe('dash-publish');
    await childLane.locator('a.child').click();
    await page.waitForURL(`**/runs/${child!.id}`);
    expect(await page.textContent('#panel .summary')).toContain(id); // the parent run, linked back
    await page.close();
  });

  it('approve a stage awaiting approval with its button: the wait is drawn, the page follows the run live to its end; reject another with a reason', async () => {
    const page = await openSignedIn(`/runs/${toApprove.id}`);
    const failures: string[] = [];
    page.on('pageerror', (e) => failures.push(e.message));
    await expect.poll(() => page.textContent('#live')).toBe('live');
    const lane = page.locator('.lane[data-stage-seq="1"]');
    expect(await lane.getAttribute('data-state')).toBe('awaiting_approval');
    expect(await lane.locator('.wait[data-wait-kind="approval"].open').count()).toBe(1);
    expect(await lane.locator('.bar[data-attempt="1"]').getAttribute('data-outcome')).toBe('waited');
    expect(await page.textContent('#panel .explain')).toContain('awaiting_approval');
    expect(await page.textContent('section.approval')).toContain('create_case');
    expect(await page.content()).not.toContain('inv-approve'); // inputs are shown by size and hash only
    await page.screenshot({ path: artefactPath('dashboard-awaiting-approval.png'), fullPage: true });

    await page.evaluate(() => {
      (window as unknown as { marker: number }).marker = 7;
    });
    await page.click(`form[data-action=approve][data-stage-id="${toApprove.stageIds[0]}"] button`);
    await expect.poll(() => page.textContent('#run-state'), { timeout: 20_000 }).toBe('succeeded');
    await expect.poll(() => page.locator('#events tr', { hasText: 'run_succeeded' }).count()).toBe(1);
    expect(await page.locator('#events tr', { hasText: 'approval_granted' }).count()).toBe(1);
    await expect.poll(() => page.textContent('#live')).toBe('finished');
    // The wait ended at the decision; a second attempt ran the approved call; the next stage ran. (The
    // panel is redrawn after the stream's last event, from the events the stream had sent: polled.)
    await expect.poll(() => lane.locator('.mark.m-decision').count()).toBe(1);
    await expect.poll(() => lane.locator('.bar[data-attempt="2"]').getAttribute('data-outcome')).toBe('succeeded');
    expect(await lane.locator('.wait[data-wait-kind="approval"]:not(.open)').count()).toBe(1);
    await expect.poll(() => page.locator('.lane[data-stage-seq="2"] .bar').getAttribute('data-outcome')).toBe('succeeded');
    expect(await page.locator('section.approval').count()).toBe(0);
    expect(await page.evaluate(() => (window as unknown as { marker?: number }).marker)).toBe(7); // updated live, no reload
    await page.screenshot({ path: artefactPath('dashboard-approved.png'), fullPage: true });
    const decided = await api.ratchet.store.db.query(`SELECT outcome, decided_by FROM ratchet.waits WHERE stage_id = $1`, [
      toApprove.stageIds[0],
    ]);
    expect(decided[0]).toMatchObject({ outcome: 'approved', decided_by: expect.stringMatching(/^token:[0-9a-f]{12}$/) });

    // Reject with a reason: the static run fails with approval_rejected, live.
    await page.goto(`${api.server.url}/runs/${toReject.id}`);
    await expect.poll(() => page.textContent('#live')).toBe('live');
    await page.fill(`form[data-action=reject][data-stage-id="${toReject.stageIds[0]}"] input[name=reason]`, 'amount looks wrong');
    await page.click(`form[data-action=reject][data-stage-id="${toReject.stageIds[0]}"] button`);
    await expect.poll(() => page.textContent('#run-state'), { timeout: 20_000 }).toBe('failed');
    expect(await page.textContent('#panel .summary')).toContain('approval_rejected');
    await expect.poll(() => page.getAttribute('.lane[data-stage-seq="1"] .mark.m-decision', 'title')).toContain('amount looks wrong');
    // Approving what was decided already: the API's refusal, shown, nothing changes.
    const again = await page.evaluate(
      async ([id, stageId]) => {
        const csrf = (document.querySelector('meta[name="csrf-token"]') as HTMLMetaElement).content;
        const r = await fetch(`/runs/${id}/stages/${stageId}/approve`, {
          method: 'POST',
          headers: { 'x-csrf-token': csrf, accept: 'application/json' },
        });
        return { status: r.status, body: await r.json() };
      },
      [toReject.id, toReject.stageIds[0]!] as const,
    );
    expect(again.status).toBe(409);
    // The rejected call never ran: its stage kept the gating claim's attempt only.
    const [rejected] = await api.ratchet.store.db.query(`SELECT state, attempt FROM ratchet.stages WHERE id = $1`, [toReject.stageIds[0]]);
    expect(rejected).toMatchObject({ state: 'failed', attempt: 1 });
    // The approved call ran once, with the input the person saw (the worker's claim after the approval).
    const [approvedStage] = await api.ratchet.store.db.query(`SELECT state, attempt, result FROM ratchet.stages WHERE id = $1`, [
      toApprove.stageIds[0],
    ]);
    expect(approvedStage).toMatchObject({ state: 'succeeded', attempt: 2, result: { caseId: 'case-inv-approve' } });
    expect(failures).toEqual([]);
    await page.close();
  }, 60_000);

  it('a failed run retried with its button: the page, whose stream had ended on run_failed, follows the run live to its new end', async () => {
    owe('dash-retry', 2); // both attempts of the first stage fail: the run fails; the retry's attempt succeeds
    const { id } = await api.client.submit('flaky', { key: 'dash-retry' });
    await until('the run to fail', async () => (await api.client.get(id)).state === 'failed');
    const page = await openSignedIn(`/runs/${id}`);
    const failures: string[] = [];
    page.on('pageerror', (e) => failures.push(e.message));
    // The page rendered run_failed; its stream, opened after it, has nothing to send (204): the page shows the run finished.
    await expect.poll(() => page.locator('#events tr', { hasText: 'run_failed' }).count()).toBe(1);
    await expect.poll(() => page.textContent('#live')).toBe('finished');
    await page.evaluate(() => {
      (window as unknown as { marker: number }).marker = 9;
    });
    await page.click('form[data-action=retry] button');
    // The events table grows only from the stream (the panel refresh does not touch it): these rows came live.
    await expect.poll(() => page.locator('#events tr', { hasText: 'run_retried' }).count(), { timeout: 20_000 }).toBe(1);
    await expect.poll(() => page.locator('#events tr', { hasText: 'run_succeeded' }).count(), { timeout: 20_000 }).toBe(1);
    await expect.poll(() => page.textContent('#run-state')).toBe('succeeded');
    await expect.poll(() => page.textContent('#live')).toBe('finished');
    expect(await page.evaluate(() => (window as unknown as { marker?: number }).marker)).toBe(9); // no reload
    // Every event of the run once in the page's table.
    const rows = await page.locator('#events tr[data-event-id]').evaluateAll((trs) => trs.map((tr) => (tr as HTMLElement).dataset.eventId));
    const table = await db.query(`SELECT id::text AS id FROM ratchet.events WHERE run_id = $1 ORDER BY coalesce(tx, '0'::xid8), id`, [id]);
    expect(new Set(rows).size).toBe(rows.length);
    expect([...rows].sort()).toEqual(table.map((r) => r.id as string).sort());
    await page.screenshot({ path: artefactPath('dashboard-retried.png'), fullPage: true });
    expect(failures).toEqual([]);
    await page.close();
  }, 60_000);

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
