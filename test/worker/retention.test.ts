import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { InvalidInputError, PermanentError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { until } from '../api/helpers.js';
import { DAY_MS, insertRuns } from '../helpers/finished-runs.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

const quick = defineToolClass({
  name: 'retention-quick',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '5s',
  maxDuration: '30s',
});
const input = z.object({ ok: z.boolean() });
const maybe = defineTool({
  name: 'maybe',
  description: 'succeeds or fails as told',
  class: quick,
  input,
  output: input,
  run: async (i) => {
    if (!i.ok) throw new PermanentError('told to fail', { code: 'told' });
    return i;
  },
});
const wf = defineWorkflow({ name: 'maybe', input, steps: [{ tool: maybe }] });

/** The retention policy of createRatchet, applied by a worker's sweeper as the database clock moves on. */
describe('retention policy (createRatchet({ retention })) applied by the sweeper', () => {
  let db: TestDatabase;
  let r: Ratchet;
  beforeAll(async () => {
    db = await createTestDatabase('retention');
    r = await createRatchet({
      databaseUrl: db.url,
      workflows: [wf],
      logger: silentLogger(),
      retention: { succeeded: '7d', failed: '30d' },
    });
  });
  afterAll(async () => {
    await r?.store.clock.setOffset(0);
    await r?.close();
    await db?.drop();
  });

  const byState = async () =>
    Object.fromEntries(
      (await db.query(`SELECT workflow || ':' || state AS k, count(*)::int AS n FROM ratchet.runs GROUP BY 1`)).map((x) => [
        x.k as string,
        x.n as number,
      ]),
    );
  const eventsOf = async (ids: string[]) =>
    (await db.query(`SELECT count(*)::int AS n FROM ratchet.events WHERE run_id = ANY($1::uuid[])`, [ids]))[0]!.n as number;

  it('prunes succeeded runs after 7 days and failed ones after 30, with their events; unfinished and unnamed states stay', async () => {
    await r.worker({ sweepIntervalMs: 50, pollIntervalMs: 20 }).start();
    const ok = await Promise.all([1, 2, 3].map(() => r.submit('maybe', { ok: true })));
    const bad = await Promise.all([1, 2].map(() => r.submit('maybe', { ok: false })));
    const ended = async (id: string) => ['succeeded', 'failed'].includes((await r.getRun(id))?.state ?? '');
    await until('runs ended', async () => (await Promise.all([...ok, ...bad].map((x) => ended(x.id)))).every(Boolean));
    // Beside them, old rows the policy does not name: cancelled runs (no age given: kept) and unfinished ones.
    await insertRuns(db, { count: 4, createdAgoMs: 90 * DAY_MS, states: ['cancelled'], workflow: 'other' });
    await insertRuns(db, {
      count: 4,
      createdAgoMs: 90 * DAY_MS,
      finished: false,
      states: ['queued', 'running'],
      workflow: 'other',
      toolClass: 'nobody',
    });
    expect(await byState()).toEqual({
      'maybe:succeeded': 3,
      'maybe:failed': 2,
      'other:cancelled': 4,
      'other:queued': 2,
      'other:running': 2,
    });
    const okIds = ok.map((x) => x.id);
    const badIds = bad.map((x) => x.id);
    expect(await eventsOf(okIds)).toBeGreaterThan(0);

    // Eight days on: the sweeper's next ticks prune the succeeded runs, not the failed ones.
    await r.store.clock.advance(8 * DAY_MS);
    await until('succeeded runs pruned', async () => !(await byState())['maybe:succeeded'], 20_000);
    expect(await eventsOf(okIds)).toBe(0);
    expect(await byState()).toEqual({ 'maybe:failed': 2, 'other:cancelled': 4, 'other:queued': 2, 'other:running': 2 });

    // Thirty-one days on: the failed ones go too; what the policy does not name is still there.
    await r.store.clock.advance(23 * DAY_MS);
    await until('failed runs pruned', async () => !(await byState())['maybe:failed'], 20_000);
    expect(await eventsOf(badIds)).toBe(0);
    expect(await byState()).toEqual({ 'other:cancelled': 4, 'other:queued': 2, 'other:running': 2 });
    const [orphans] = await db.query(
      `SELECT count(*)::int AS n FROM ratchet.events e WHERE NOT EXISTS (SELECT 1 FROM ratchet.runs r WHERE r.id = e.run_id)`,
    );
    expect(orphans!.n).toBe(0);
  });

  it('refuses a bad policy before opening anything', async () => {
    for (const retention of [{ succeeded: 'never' }, { running: '1d' }, { failed: 0 }, { succeeded: '-1d' }]) {
      await expect(
        createRatchet({ dataDir: ':memory:', workflows: [wf], retention: retention as never }),
        JSON.stringify(retention),
      ).rejects.toBeInstanceOf(InvalidInputError);
    }
  });
});
