import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startApi, type Api } from './helpers.js';

/** GET /v1/runs (filters, keyset pagination) and GET /v1/runs/:id/events paging, on PostgreSQL, no worker. */
let db: TestDatabase;
let api: Api;
const ids: { id: string; workflow: string }[] = [];
let middle: string;
beforeAll(async () => {
  db = await createTestDatabase('api_list');
  api = await startApi({ databaseUrl: db.url });
  for (let i = 0; i < 7; i++) {
    const workflow = i % 2 === 0 ? 'orphan' : 'ghost';
    const r = await api.client.submit(workflow, { key: `list-${i}` });
    ids.push({ id: r.id, workflow });
    if (i === 3) middle = (await api.client.get(r.id)).createdAt;
  }
  await api.client.cancel(ids[1]!.id);
  await api.client.cancel(ids[4]!.id);
  // Two runs in the same microsecond range as others would still page correctly: force equal created_at on two rows.
  await db.query('UPDATE ratchet.runs SET created_at = (SELECT created_at FROM ratchet.runs WHERE id = $1) WHERE id = $2', [
    ids[5]!.id,
    ids[6]!.id,
  ]);
});
afterAll(async () => {
  await api?.close();
  await db?.drop();
});

describe('GET /v1/runs', () => {
  it('pages through every run, newest first, without repeats or gaps', async () => {
    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const page = await api.client.list({ limit: 2, ...(cursor ? { cursor } : {}) });
      expect(page.runs.length).toBeLessThanOrEqual(2);
      seen.push(...page.runs.map((r) => r.id));
      cursor = page.nextCursor ?? undefined;
      pages++;
    } while (cursor && pages < 10);
    expect(pages).toBe(4);
    expect(new Set(seen).size).toBe(7);
    expect([...seen].sort()).toEqual(ids.map((i) => i.id).sort());
    const all = await api.client.list({ limit: 100 });
    expect(all.nextCursor).toBeNull();
    expect(all.runs.map((r) => r.id)).toEqual(seen);
    const created = all.runs.map((r) => Date.parse(r.createdAt));
    expect(created).toEqual([...created].sort((a, b) => b - a));
  });

  it('filters by state, workflow and creation time', async () => {
    const cancelled = await api.client.list({ state: 'cancelled' });
    expect(cancelled.runs.map((r) => r.id).sort()).toEqual([ids[1]!.id, ids[4]!.id].sort());
    expect(cancelled.runs.every((r) => r.error !== null)).toBe(true);
    const both = await api.client.list({ state: ['cancelled', 'queued'] });
    expect(both.runs).toHaveLength(7);
    const ghost = await api.client.list({ workflow: 'ghost' });
    expect(ghost.runs.map((r) => r.id).sort()).toEqual(
      ids
        .filter((i) => i.workflow === 'ghost')
        .map((i) => i.id)
        .sort(),
    );
    const queuedOrphans = await api.client.list({ workflow: 'orphan', state: 'queued' });
    expect(queuedOrphans.runs.map((r) => r.id).sort()).toEqual([ids[0]!.id, ids[2]!.id, ids[6]!.id].sort());
    const after = await api.client.list({ createdAfter: middle });
    expect(after.runs.map((r) => r.id)).toContain(ids[3]!.id); // inclusive
    expect(after.runs.map((r) => r.id)).not.toContain(ids[2]!.id);
    const before = await api.client.list({ createdBefore: middle });
    expect(before.runs.map((r) => r.id).sort()).toEqual(
      ids
        .slice(0, 3)
        .map((i) => i.id)
        .sort(),
    ); // exclusive
    expect((await api.client.list({ workflow: 'nope' })).runs).toEqual([]);
  });

  it('refuses bad filters and foreign cursors with a path', async () => {
    expect(await api.http('/v1/runs?state=bogus')).toMatchObject({
      status: 400,
      body: { error: { code: 'invalid_request', path: 'state' } },
    });
    expect(await api.http('/v1/runs?limit=0')).toMatchObject({ status: 400, body: { error: { path: 'limit' } } });
    expect(await api.http('/v1/runs?limit=9999')).toMatchObject({ status: 400, body: { error: { path: 'limit' } } });
    expect(await api.http('/v1/runs?createdAfter=yesterday')).toMatchObject({ status: 400, body: { error: { path: 'createdAfter' } } });
    expect(await api.http('/v1/runs?sort=asc')).toMatchObject({ status: 400, body: { error: { path: 'sort' } } });
    expect(await api.http('/v1/runs?cursor=AAAA')).toMatchObject({
      status: 422,
      body: { error: { code: 'invalid_input', path: 'listRuns.cursor' } },
    });
  });
});

describe('GET /v1/runs/:id/events', () => {
  it("pages a run's events oldest first; an unknown id is 404 unknown_run", async () => {
    const id = ids[1]!.id;
    const all = await api.client.events(id);
    expect(all.events.map((e) => e.type)).toEqual(['run_submitted', 'run_cancelled', 'stage_cancelled']);
    expect(all.nextCursor).toBeNull();
    const first = await api.client.events(id, { limit: 2 });
    expect(first.events).toHaveLength(2);
    const rest = await api.client.events(id, { after: first.nextCursor! });
    expect([...first.events, ...rest.events].map((e) => e.id)).toEqual(all.events.map((e) => e.id));
    const empty = await api.client.events(id, { after: all.events.at(-1)!.id });
    expect(empty).toMatchObject({ events: [], nextCursor: null });
    expect(await api.http('/v1/runs/01890f4e-0000-7000-8000-000000000000/events')).toMatchObject({
      status: 404,
      body: { error: { code: 'unknown_run' } },
    });
    expect(await api.http('/v1/runs/01890f4e-0000-7000-8000-000000000000')).toMatchObject({
      status: 404,
      body: { error: { code: 'unknown_run' } },
    });
    expect(await api.http('/v1/runs/nonsense/explain')).toMatchObject({ status: 404, body: { error: { code: 'unknown_run' } } });
  });
});
