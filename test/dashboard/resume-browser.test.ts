import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EVENTS_SHOWN } from '../../src/dashboard/pages.js';
import { apiWorkflows, callsOf, owe, release } from '../api/fixtures.js';
import { startApi, TOKEN, until, type Api } from '../api/helpers.js';
import { artefactPath, launchBrowser, type Browser } from '../helpers/browser.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * The run page and its stream in headless Chromium on PostgreSQL: the page renders the run's
 * events read in stream order and opens the stream after the last one it rendered (never from
 * the start), so it shows every event once, an event a slower transaction commits later with a
 * lower id included; a long run's page shows the newest events and says how many it leaves out;
 * a failed run retried through the API after the page's stream ended is followed live again.
 * Screenshots in test-artefacts/.
 */
let db: TestDatabase;
let api: Api;
let browser: Browser;

/** What each EventSource the page opened saw: its URL, the event rows the page had then, the ids of its messages. */
interface StreamRecord {
  url: string;
  rendered: string[];
  ids: string[];
}

beforeAll(async () => {
  db = await createTestDatabase('dashboard_resume');
  api = await startApi({ databaseUrl: db.url, poolSize: 8, streamHeartbeatMs: 1000, workflows: apiWorkflows });
  await api.ratchet.worker({ classes: ['quick', 'long'], pollIntervalMs: 50, concurrency: 4 }).start();
  browser = await launchBrowser();
  const page = await browser.context.newPage();
  await page.goto(`${api.server.url}/`);
  await page.fill('input[name=token]', TOKEN);
  await page.click('button[type=submit]');
  await page.waitForSelector('table.runs');
  await page.close();
}, 120_000);
afterAll(async () => {
  await browser?.close();
  await api?.close();
  await db?.drop();
});

/** The run page, with every EventSource it opens recorded (window.__streams). */
async function openRunPage(id: string) {
  const page = await browser.context.newPage();
  const failures: string[] = [];
  page.on('pageerror', (e) => failures.push(e.message));
  await page.addInitScript(() => {
    const w = window as unknown as { __streams: StreamRecord[]; EventSource: typeof EventSource };
    w.__streams = [];
    const Native = w.EventSource;
    w.EventSource = class extends Native {
      constructor(url: string | URL, init?: EventSourceInit) {
        super(url, init);
        const rec: StreamRecord = {
          url: String(url),
          rendered: Array.from(document.querySelectorAll<HTMLElement>('#events tr[data-event-id]'), (tr) => tr.dataset.eventId!),
          ids: [],
        };
        w.__streams.push(rec);
        this.addEventListener('message', (m) => rec.ids.push((m as MessageEvent).lastEventId));
      }
    };
  });
  await page.goto(`${api.server.url}/runs/${id}`);
  await page.waitForSelector('#panel');
  const streams = () => page.evaluate(() => (window as unknown as { __streams: StreamRecord[] }).__streams);
  const rows = () => page.locator('#events tr[data-event-id]').evaluateAll((trs) => trs.map((tr) => (tr as HTMLElement).dataset.eventId!));
  return { page, failures, streams, rows };
}

/** The run's event ids in stream order ((tx, id): the order the stream sends them). */
const streamOrder = async (runId: string) =>
  (
    await db.query(`SELECT e.id::text AS id FROM ratchet.events e WHERE e.run_id = $1 ORDER BY coalesce(e.tx, '0'::xid8), e.id`, [runId])
  ).map((r) => r.id as string);

/**
 * Until every event of the run is final (no transaction of the cluster still running is older
 * than its own): other tests' transactions hold the streams back, and what a page renders with them.
 */
const allFinal = (runId: string) =>
  until(`run ${runId}'s events to be final`, async () => {
    const [r] = await db.query(
      `SELECT count(*) FILTER (WHERE coalesce(tx, '0'::xid8) >= pg_snapshot_xmin(pg_current_snapshot()))::int AS held FROM ratchet.events WHERE run_id = $1`,
      [runId],
    );
    return r?.held === 0;
  });

async function connect(): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: db.url });
  await c.connect();
  return c;
}
const insertMarker = async (c: pg.Client, runId: string, note: string) =>
  (
    await c.query(
      `INSERT INTO ratchet.events (run_id, type, data) VALUES ($1, 'test_marker', jsonb_build_object('reason', $2::text)) RETURNING id::text AS id`,
      [runId, note],
    )
  ).rows[0].id as string;

describe('dashboard run page: the stream resumes where the page is', () => {
  it('opens the stream after the last event it rendered (read in stream order): an event committed later with a lower id is shown, every event once, in stream order', async () => {
    const key = 'resume-order';
    const { id } = await api.client.submit('gate', { key });
    await until('the gate stage to run', async () => callsOf('gate', key).length > 0);
    await allFinal(id);
    // Two transactions write the run's events: A first (the lower id, the older transaction), B
    // after it, and B commits first. Until A ends, B's event is held back: a page that rendered
    // B's event and resumed after the highest id would never get A's.
    const a = await connect();
    const b = await connect();
    try {
      await a.query('BEGIN');
      const low = await insertMarker(a, id, 'A: lower id, commits last');
      await b.query('BEGIN');
      const high = await insertMarker(b, id, 'B: higher id, commits first');
      await b.query('COMMIT');
      expect(BigInt(low)).toBeLessThan(BigInt(high));

      const { page, failures, streams, rows } = await openRunPage(id);
      await expect.poll(async () => (await streams()).length).toBeGreaterThan(0);
      const [first] = await streams();
      // Rendered: the stream's final prefix, without A's event (running) nor B's (held back behind A).
      expect(first!.rendered.length).toBeGreaterThan(0);
      expect(first!.rendered).not.toContain(low);
      expect(first!.rendered).not.toContain(high);
      const after = first!.rendered.at(-1)!;
      expect(await page.getAttribute('#run', 'data-after')).toBe(after);
      expect(first!.url).toBe(`/runs/${id}/stream?after=${after}`);
      await expect.poll(() => page.textContent('#live')).toBe('live');

      await a.query('COMMIT'); // A's event, lower id, commits after B's
      await expect.poll(async () => (await rows()).filter((r) => r === low || r === high), { timeout: 20_000 }).toEqual([low, high]);

      release(key); // the run goes on to its end, live
      await expect.poll(() => page.textContent('#run-state'), { timeout: 20_000 }).toBe('succeeded');
      await expect.poll(() => page.locator('#events tr', { hasText: 'run_succeeded' }).count(), { timeout: 20_000 }).toBe(1);
      await expect.poll(() => page.textContent('#live')).toBe('finished');
      const order = await streamOrder(id);
      // Every event once, in stream order: what the page rendered, then what its streams sent, none twice.
      expect(await rows()).toEqual(order);
      const all = await streams();
      const sent = all.flatMap((s) => s.ids);
      expect(sent.filter((i) => first!.rendered.includes(i))).toEqual([]);
      expect([...first!.rendered, ...sent]).toEqual(order);
      for (const s of all) expect(s.url).toMatch(new RegExp(`^/runs/${id}/stream\\?after=\\d+$`));
      await page.screenshot({ path: artefactPath('dashboard-resume-order.png'), fullPage: true });
      expect(failures).toEqual([]);
      await page.close();
    } finally {
      await a.end().catch(() => {});
      await b.end().catch(() => {});
    }
  }, 60_000);

  it(`a long run: the page shows the newest ${EVENTS_SHOWN} events, says how many earlier ones it leaves out, and resumes after the last; rows it drops live are counted too`, async () => {
    const key = 'resume-long';
    const { id } = await api.client.submit('gate', { key });
    await until('the gate stage to run', async () => callsOf('gate', key).length > 0);
    await db.query(
      `INSERT INTO ratchet.events (run_id, type, data) SELECT $1, 'test_marker', jsonb_build_object('reason', 'bulk ' || g) FROM generate_series(1, $2::int) g`,
      [id, EVENTS_SHOWN + 150],
    );
    await allFinal(id);
    const before = await streamOrder(id);
    const { page, failures, streams, rows } = await openRunPage(id);
    await expect.poll(() => page.textContent('#live')).toBe('live');
    expect(await rows()).toEqual(before.slice(-EVENTS_SHOWN));
    expect(await page.textContent('#events-earlier .count')).toBe(String(before.length - EVENTS_SHOWN));
    expect(await page.textContent('#timeline-partial')).toContain(`newest ${EVENTS_SHOWN} events`);
    expect((await streams())[0]!.url).toBe(`/runs/${id}/stream?after=${before.at(-1)}`);

    // Keep two rows more than shown: the events the run's end brings push the oldest out, counted.
    await page.evaluate((n) => {
      document.getElementById('events')!.dataset.keep = String(n);
    }, EVENTS_SHOWN + 2);
    release(key);
    await expect.poll(() => page.textContent('#run-state'), { timeout: 20_000 }).toBe('succeeded');
    await expect.poll(() => page.locator('#events tr', { hasText: 'run_succeeded' }).count(), { timeout: 20_000 }).toBe(1);
    const order = await streamOrder(id);
    expect(order.length).toBeGreaterThan(before.length + 2);
    const shown = await rows();
    expect(shown).toEqual(order.slice(-(EVENTS_SHOWN + 2)));
    expect(Number(await page.textContent('#events-earlier .count')) + shown.length).toBe(order.length);
    expect((await streams()).flatMap((s) => s.ids)).toEqual(order.slice(before.length));
    await page.locator('#events-earlier').scrollIntoViewIfNeeded();
    await page.screenshot({ path: artefactPath('dashboard-resume-long.png') });
    expect(failures).toEqual([]);
    await page.close();
  }, 60_000);

  it('a failed run retried through the API after its page stream ended: the page notices and follows the run live to its new end', async () => {
    owe('resume-retry', 2); // both attempts of the first stage fail: the run fails; the retry's attempt succeeds
    const { id } = await api.client.submit('flaky', { key: 'resume-retry' });
    await until('the run to fail', async () => (await api.client.get(id)).state === 'failed');
    await allFinal(id);
    const { page, failures, streams, rows } = await openRunPage(id);
    await expect.poll(() => page.textContent('#live')).toBe('finished');
    expect(await page.locator('#events tr', { hasText: 'run_failed' }).count()).toBe(1);
    await page.evaluate(() => {
      (window as unknown as { marker: number }).marker = 11;
    });

    await api.client.retry(id); // not the page's button: the API, as the CLI does
    // The events table grows only from the stream: these rows came live.
    await expect.poll(() => page.locator('#events tr', { hasText: 'run_retried' }).count(), { timeout: 30_000 }).toBe(1);
    await expect.poll(() => page.locator('#events tr', { hasText: 'run_succeeded' }).count(), { timeout: 20_000 }).toBe(1);
    await expect.poll(() => page.textContent('#run-state')).toBe('succeeded');
    await expect.poll(() => page.textContent('#live')).toBe('finished');
    expect(await page.evaluate(() => (window as unknown as { marker?: number }).marker)).toBe(11); // no reload
    const order = await streamOrder(id);
    expect(await rows()).toEqual(order);
    const all = await streams();
    // What the page rendered, then what its streams sent.
    expect([...all[0]!.rendered, ...all.flatMap((s) => s.ids)]).toEqual(order);
    for (const s of all) expect(s.url).toMatch(new RegExp(`^/runs/${id}/stream\\?after=\\d+$`));
    await page.screenshot({ path: artefactPath('dashboard-resume-retried.png'), fullPage: true });
    expect(failures).toEqual([]);
    await page.close();
  }, 60_000);

  it('a succeeded run cannot be retried: once its stream ended, the page does not check it again', async () => {
    const { id } = await api.client.submit('echo', { key: 'resume-done' });
    await until('the run to succeed', async () => (await api.client.get(id)).state === 'succeeded');
    await allFinal(id);
    const { page, failures, streams } = await openRunPage(id);
    await expect.poll(() => page.textContent('#live')).toBe('finished');
    const opened = (await streams()).length;
    await page.waitForTimeout(5000); // past the first two checks of a failed run's page (2 s, then 4 s, jittered)
    expect((await streams()).length).toBe(opened);
    expect(failures).toEqual([]);
    await page.close();
  }, 60_000);
});
