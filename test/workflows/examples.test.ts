import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServices, type Services } from '../../examples/services.js';
import { createRatchet, type Ratchet, type RunView } from '../../src/index.js';
import { silentLogger } from '../../src/logger.js';
import type { Worker } from '../../src/worker/worker.js';
import { SERVICES_URL_ENV } from '../../workflows/_lib/services-url.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * The example workflows (workflows/) end to end on the embedded default, against the example
 * services (examples/services.ts) on a random loopback port. The witness is the receiver's own
 * database: count cases and reports there, not log lines.
 */
let db: TestDatabase;
let services: Services;
let ratchet: Ratchet;
let worker: Worker;

/** Points the tools at `s` (they read the URL at call time). */
const use = (s: Services) => {
  process.env[SERVICES_URL_ENV] = s.url;
};

async function finished(id: string, timeoutMs = 30_000): Promise<RunView> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const run = await ratchet.getRun(id);
    if (run && ['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state)) return run;
    if (Date.now() > until) throw new Error(`run ${id} still ${run?.state} after ${timeoutMs} ms: ${JSON.stringify(run?.stages)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function runToEnd(workflow: string, input: unknown): Promise<RunView> {
  const { id } = await ratchet.submit(workflow, input);
  return finished(id);
}

beforeAll(async () => {
  db = await createTestDatabase('examples', { empty: true });
  services = await startServices({ databaseUrl: db.url });
  expect(services.storage).toBe('postgres');
  ratchet = await createRatchet({ dataDir: ':memory:', workflowsDir: 'workflows', logger: silentLogger() });
  worker = ratchet.worker({ pollIntervalMs: 100 });
  await worker.start();
});

afterAll(async () => {
  await worker?.stop({ graceMs: 0 });
  await ratchet?.close();
  await services?.close();
  await db?.drop();
});

describe('workflows/ on the embedded default, receivers on PostgreSQL', () => {
  it('loads the example workflows and the agent with their own tool classes', () => {
    expect(
      ratchet.registry
        .list()
        .map((w) => w.name)
        .sort(),
    ).toEqual(['invoice-agent', 'publish-digest', 'publish-report', 'reconcile-invoice', 'research-digest']);
    expect(ratchet.registry.toolClasses().map((c) => c.name)).toEqual([
      '$control',
      'digest-io',
      'invoice-compute',
      'invoice-http',
      'model',
      'report-compute',
      'report-http',
    ]);
  });

  it('reconcile-invoice: fetch, extract, file one case through the fenced receiver', async () => {
    use(services);
    const run = await runToEnd('reconcile-invoice', { invoiceId: 'inv-42' });
    expect(run.state, JSON.stringify(run.error)).toBe('succeeded');
    expect(run.stages.map((s) => [s.tool, s.state, s.attempt])).toEqual([
      ['fetch_statement', 'succeeded', 1],
      ['extract_fields', 'succeeded', 1],
      ['file_case', 'succeeded', 1],
    ]);
    expect(run.result).toMatchObject({ key: 'invoice:inv-42:create-case', outcome: expect.any(String), replayed: false });

    const { cases, requests } = await services.effects();
    expect(cases).toEqual([
      expect.objectContaining({ key: 'invoice:inv-42:create-case', invoiceId: 'inv-42', fence: run.stages[2]!.fence }),
    ]);
    expect(requests).toEqual([
      expect.objectContaining({
        path: '/cases',
        key: 'invoice:inv-42:create-case',
        fence: run.stages[2]!.fence,
        status: 201,
        replayed: false,
      }),
    ]);
  });

  it('a resubmitted run for the same invoice derives the same key and makes no second case', async () => {
    use(services);
    const first = (await services.effects()).cases[0]!;
    const run = await runToEnd('reconcile-invoice', { invoiceId: 'inv-42' });
    expect(run.state).toBe('succeeded');
    expect(run.result).toMatchObject({ key: first.key, caseId: first.caseId, replayed: true });
    // A new run: new stages, a greater fence, the same answer.
    expect(BigInt(run.stages[2]!.fence!)).toBeGreaterThan(BigInt(first.fence));

    const { cases, requests } = await services.effects();
    expect(cases).toHaveLength(1);
    expect(requests.filter((r) => r.path === '/cases').map((r) => [r.status, r.replayed])).toEqual([
      [201, false],
      [201, true],
    ]);
  });

  it('publish-report: gather, normalise, draft, review, publish once', async () => {
    use(services);
    const run = await runToEnd('publish-report', { reportId: 'q2-sales', period: '2024-Q2', regions: ['emea', 'amer', 'apac'] });
    expect(run.state, JSON.stringify(run.error)).toBe('succeeded');
    expect(run.stages.map((s) => [s.tool, s.state])).toEqual([
      ['gather', 'succeeded'],
      ['normalise', 'succeeded'],
      ['draft', 'succeeded'],
      ['review', 'succeeded'],
      ['publish', 'succeeded'],
    ]);
    expect(run.result).toMatchObject({ reportId: 'q2-sales', key: 'report:q2-sales:publish', replayed: false });
    const { reports } = await services.effects();
    expect(reports).toEqual([
      { key: 'report:q2-sales:publish', reportId: 'q2-sales', title: 'Sales report 2024-Q2', fence: run.stages[4]!.fence },
    ]);
  });

  it('a statement that does not exist fails the run at once (a 404 is permanent), filing nothing', async () => {
    use(services);
    const before = (await services.effects()).cases.length;
    const run = await runToEnd('reconcile-invoice', { invoiceId: 'missing-7' });
    expect(run.state).toBe('failed');
    expect(run.error).toMatchObject({ code: 'unknown_statement', kind: 'permanent' });
    expect(run.stages.map((s) => [s.state, s.attempt])).toEqual([
      ['failed', 1],
      ['cancelled', 0],
      ['cancelled', 0],
    ]);
    expect((await services.effects()).cases).toHaveLength(before);
  });

  it('bad input is refused before anything is persisted', async () => {
    await expect(ratchet.submit('reconcile-invoice', { invoiceId: 'no spaces allowed' })).rejects.toMatchObject({ code: 'invalid_input' });
    await expect(ratchet.submit('no-such-workflow', {})).rejects.toMatchObject({ code: 'invalid_input' });
  });
});

describe('faults, with the services on in-memory PGlite (the pool adapter)', () => {
  it('a 503 is retried; a case whose answer was lost is found by reconcile(), not filed twice', async () => {
    const flaky = await startServices({ faults: { fail: { statements: 1 }, dropAnswer: { cases: 1 } }, onError: () => {} });
    try {
      expect(flaky.storage).toBe('pglite');
      use(flaky);
      const run = await runToEnd('reconcile-invoice', { invoiceId: 'inv-77' });
      expect(run.state, JSON.stringify(run.error)).toBe('succeeded');
      expect(run.stages.map((s) => [s.tool, s.attempt])).toEqual([
        ['fetch_statement', 2],
        ['extract_fields', 1],
        ['file_case', 2],
      ]);
      expect(run.result).toMatchObject({ key: 'invoice:inv-77:create-case', replayed: true });

      const { cases, requests } = await flaky.effects();
      expect(cases).toHaveLength(1);
      // One POST (its answer dropped); the second attempt asked GET /cases/:key instead of posting again.
      expect(requests).toEqual([expect.objectContaining({ path: '/cases', dropped: true, status: 201, fence: cases[0]!.fence })]);
      const types = (await ratchet.events(run.id)).map((e) => e.type);
      expect(types).toEqual(expect.arrayContaining(['tool_request_started', 'outcome_unknown', 'reconciled']));
    } finally {
      use(services);
      await flaky.close();
    }
  });
});

describe('workflows/research-digest.ts: a fan-out, a join, a map and a child run that publishes once', () => {
  it('runs end to end: the join after all searches, the summaries in order, the digest published once at the fenced receiver', async () => {
    use(services);
    const { id } = await ratchet.submit('research-digest', { topic: 'leases', digestId: 'd-1' });
    const run = await finished(id);
    expect(run.state, JSON.stringify(run.error)).toBe('succeeded');
    const full = (await ratchet.store.getRun(id))!;
    const by = (name: string) => full.stages.find((s) => s.name === name)!;
    expect(
      ['search_news', 'search_papers', 'search_forums', 'pick_articles', 'summaries', 'merge', 'publish'].map((n) => [n, by(n).state]),
    ).toEqual([
      ['search_news', 'succeeded'],
      ['search_papers', 'succeeded'],
      ['search_forums', 'skipped'],
      ['pick_articles', 'succeeded'],
      ['summaries', 'succeeded'],
      ['merge', 'succeeded'],
      ['publish', 'succeeded'],
    ]);
    // The join ran once, after both searches that ran, with both lists.
    const urls = (by('pick_articles').result as { urls: string[] }).urls;
    expect(urls).toEqual([
      'https://news.example/leases/1',
      'https://news.example/leases/2',
      'https://papers.example/leases/1',
      'https://papers.example/leases/2',
    ]);
    const events = await ratchet.events(id);
    const claimOf = (name: string) => events.filter((e) => e.type === 'job_claimed' && e.stageId === by(name).id);
    expect(claimOf('pick_articles')).toHaveLength(1);
    const joinAt = claimOf('pick_articles')[0]!.at.getTime();
    for (const n of ['search_news', 'search_papers']) {
      const done = events.find((e) => e.type === 'stage_succeeded' && e.stageId === by(n).id);
      expect(done, n).toBeDefined();
      expect(done!.at.getTime(), n).toBeLessThanOrEqual(joinAt);
    }
    // The map: one stage per article, the results in item order.
    expect((by('summaries').result as { url: string }[]).map((p) => p.url)).toEqual(urls);
    // The child run published the digest once, through the fenced receiver, under the digest's key.
    expect(full.children).toHaveLength(1);
    const kid = (await ratchet.store.getRun(full.children![0]!.id))!;
    expect(kid).toMatchObject({ workflow: 'publish-digest', state: 'succeeded', parentRunId: id });
    expect(run.result).toMatchObject({ reportId: 'd-1', key: 'digest:d-1:publish', replayed: false });
    const { reports, requests } = await services.effects();
    expect(reports.filter((r) => r.key === 'digest:d-1:publish')).toEqual([
      expect.objectContaining({ reportId: 'd-1', fence: kid.stages[0]!.fence }),
    ]);
    expect(requests.filter((r) => r.key === 'digest:d-1:publish')).toEqual([
      expect.objectContaining({ path: '/reports', fence: kid.stages[0]!.fence, status: 201, replayed: false }),
    ]);
  });
});
