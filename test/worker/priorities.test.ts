import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * Priorities (issue 15) end to end on PostgreSQL: a backlog of low-priority runs waits while a
 * burst of high-priority runs is submitted; one worker then drains them and the high-priority
 * runs finish first (a few low ones pass by age: one claim in AGE_SHARE). A workflow's default
 * priority applies when the submitter gives none, and a bad one is refused with nothing written.
 */
const cls = defineToolClass({ name: 'prio_cls', lease: '5s', heartbeat: '1s', jitter: '100ms', timeout: '10s', maxDuration: '30s' });
const empty = z.object({}).passthrough();
const work = defineTool({
  name: 'prio_work',
  description: 'a short piece of work',
  class: cls,
  input: empty,
  output: empty,
  run: async () => {
    await new Promise((r) => setTimeout(r, 5));
    return {};
  },
});
const workflows = [
  defineWorkflow({ name: 'prio', input: empty, steps: [{ tool: work }] }),
  defineWorkflow({ name: 'prio_urgent', input: empty, priority: 30, steps: [{ tool: work }] }),
];

describe('priorities end to end', () => {
  let db: TestDatabase;
  let r: Ratchet;
  beforeAll(async () => {
    db = await createTestDatabase('priorities_e2e');
    r = await createRatchet({ databaseUrl: db.url, workflows, logger: silentLogger() });
  });
  afterAll(async () => {
    await r?.close();
    await db?.drop();
  });

  it('a burst of high-priority runs submitted after a backlog of low ones finishes first', async () => {
    const low: string[] = [];
    for (let i = 0; i < 60; i++) low.push((await r.submit('prio', { i })).id);
    const high: string[] = [];
    for (let i = 0; i < 10; i++) high.push((await r.submit('prio', { i }, { priority: 20 })).id);
    const w = r.worker({ pollIntervalMs: 20, concurrency: 2 });
    await w.start();
    try {
      for (let i = 0; i < 800; i++) {
        const n = (await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM ratchet.runs WHERE state <> 'succeeded'`))[0]!.n;
        if (n === 0) break;
        await new Promise((res) => setTimeout(res, 25));
      }
    } finally {
      await w.stop({ graceMs: 1000 });
    }
    const rows = await db.query<{ id: string; priority: number; claimed: string }>(
      `SELECT r.id, r.priority, s.first_claimed_at AS claimed FROM ratchet.runs r JOIN ratchet.stages s ON s.run_id = r.id WHERE r.state = 'succeeded' ORDER BY s.first_claimed_at, s.id`,
    );
    expect(rows).toHaveLength(70);
    const lastHigh = Math.max(...rows.map((x, i) => (x.priority === 20 ? i : -1)));
    const lowsBefore = rows.slice(0, lastHigh).filter((x) => x.priority === 0).length;
    expect(lowsBefore).toBeLessThanOrEqual(10); // the age share lets a few low ones by, never the backlog
    expect(new Set(high)).toEqual(new Set(rows.filter((x) => x.priority === 20).map((x) => x.id)));
  });

  it("a workflow's default priority applies without one; the submitter's overrides it; a bad one writes nothing", async () => {
    const byDefault = await r.submit('prio_urgent', {});
    const given = await r.submit('prio_urgent', {}, { priority: -5 });
    expect((await r.store.getRun(byDefault.id))!.priority).toBe(30);
    expect((await r.store.getRun(given.id))!.priority).toBe(-5);
    const [before] = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM ratchet.runs');
    await expect(r.submit('prio', {}, { priority: 101 })).rejects.toMatchObject({ code: 'invalid_input' });
    await expect(r.submit('prio', {}, { priority: 0.5 })).rejects.toMatchObject({ code: 'invalid_input' });
    const [after] = await db.query<{ n: number }>('SELECT count(*)::int AS n FROM ratchet.runs');
    expect(after!.n).toBe(before!.n);
  });
});
