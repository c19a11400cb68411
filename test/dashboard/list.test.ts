import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { beginWait } from '../../src/store/signals.js';
import { startApi, TOKEN, type Api } from '../api/helpers.js';
import { allowWaitStates, claimStage, createAgentRun, createWaitRun, gated, waitWorkflows } from '../api/waits-fixtures.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * The runs list's awaiting-approval panel and view narrow to the workflow in SQL and page on with a
 * cursor (205 approvals of `gated`, older than 3 of `gated_agent`: filtering by gated_agent used to
 * find none in the oldest 201); a bad cursor is a 400 saying so, never an empty "No runs." page.
 */
let db: TestDatabase;
let api: Api;
const GATED = 205;
const AGENT = 3;
beforeAll(async () => {
  db = await createTestDatabase('dashboard_list');
  api = await startApi({ databaseUrl: db.url, poolSize: 8, workflows: waitWorkflows });
  await allowWaitStates(api.ratchet.store.db);
  for (let i = 0; i < GATED; i++) {
    const run = await createWaitRun(api.ratchet, gated, { invoiceId: `inv-${i}`, amount: 1 });
    const lease = await claimStage(api.ratchet.store.db, run.stageIds[0]!);
    expect((await beginWait(api.ratchet.store.db, lease, { kind: 'approval', until: null })).verdict).toBe('waiting');
  }
  for (let i = 0; i < AGENT; i++) {
    const run = await createAgentRun(api.ratchet, { invoiceId: `agent-${i}`, amount: 1 });
    const lease = await claimStage(api.ratchet.store.db, run.stageIds[1]!);
    expect((await beginWait(api.ratchet.store.db, lease, { kind: 'approval', until: null })).verdict).toBe('waiting');
  }
}, 120_000);
afterAll(async () => {
  await api?.close();
  await db?.drop();
});

const get = async (path: string) => {
  const res = await fetch(`${api.server.url}${path}`, { headers: { cookie: `ratchet_token=${TOKEN}`, accept: 'text/html' } });
  return { status: res.status, text: await res.text() };
};
const approvalRows = (text: string) => [...text.matchAll(/<tr data-run-id="[^"]+" data-stage-id="([^"]+)">/g)].map((m) => m[1]!);
const nextLink = (text: string) => /<a rel="next" href="([^"]+)">More awaiting approval/.exec(text)?.[1]?.replaceAll('&amp;', '&');

describe('dashboard: awaiting approval', () => {
  it('the list panel filtered by a workflow shows its approvals even behind 200+ older ones of another', async () => {
    const { status, text } = await get('/?workflow=gated_agent');
    expect(status).toBe(200);
    expect(approvalRows(text)).toHaveLength(AGENT);
    expect(text).not.toContain('all that await approval');
    const all = await get('/?workflow=gated');
    expect(approvalRows(all.text)).toHaveLength(10);
    expect(all.text).toContain('all that await approval');
  });

  it('the awaiting view pages past 200 with its cursor, each approval once, the workflow kept', async () => {
    const seen: string[] = [];
    let path: string | undefined = '/?state=awaiting_approval&workflow=gated';
    let pages = 0;
    while (path) {
      const { status, text } = await get(path);
      expect(status).toBe(200);
      seen.push(...approvalRows(text));
      path = nextLink(text);
      if (path) expect(path).toContain('workflow=gated');
      pages++;
    }
    expect(pages).toBe(2);
    expect(seen).toHaveLength(GATED);
    expect(new Set(seen).size).toBe(GATED);
    const agent = await get('/?state=awaiting_approval&workflow=gated_agent');
    expect(approvalRows(agent.text)).toHaveLength(AGENT);
    expect(nextLink(agent.text)).toBeUndefined();
  });

  it('a bad cursor is a 400 with a message (runs list and awaiting view), not an empty page', async () => {
    for (const path of ['/?cursor=not-a-cursor', '/?state=awaiting_approval&cursor=not-a-cursor']) {
      const { status, text } = await get(path);
      expect(status, path).toBe(400);
      expect(text).toContain('not a cursor this server gave out');
      expect(text).not.toContain('No runs.');
    }
  });

  it('a workflow filter with a U+0000 is a 400 as on the API (its rule), not a 500 from the database', async () => {
    for (const path of ['/?workflow=a%00b', '/?state=awaiting_approval&workflow=a%00', `/?workflow=${'w'.repeat(201)}`]) {
      const { status, text } = await get(path);
      expect(status, path).toBe(400);
      expect(text, path).toContain('Bad request');
      expect(text, path).not.toContain('Could not list runs');
    }
    expect((await get('/?workflow=a%00b')).text).toContain('must not contain');
    expect((await api.http('/v1/runs?workflow=a%00b')).status).toBe(400);
  });
});
