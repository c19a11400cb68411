import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { fireDueSchedules, tickRunKey, FIRING_LEASE_MS } from '../../src/schedules/fire.js';
import { leaseDueSchedules } from '../../src/store/schedules.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

const cls = defineToolClass({ name: 'sched-fire', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '2s', maxDuration: '10s' });
const echo = defineTool({
  name: 'sched_fire_echo',
  description: 'echo',
  class: cls,
  input: z.object({ n: z.number() }),
  output: z.object({ n: z.number() }),
  run: async (i) => i,
});
const wf = defineWorkflow({ name: 'sched-fire', input: z.object({ n: z.number() }), steps: [{ tool: echo }] });

/**
 * The firing pass on PostgreSQL with the movable database clock: no worker runs here, so runs
 * stay queued (the overlap check sees them going) and each pass is called by hand.
 */
describe('firing schedules by the database clock', () => {
  let db: TestDatabase;
  let r: Ratchet;
  beforeAll(async () => {
    db = await createTestDatabase('sched_fire');
    r = await createRatchet({ databaseUrl: db.url, workflows: [wf], logger: silentLogger() });
  });
  afterAll(async () => {
    await r?.close();
    await db?.drop();
  });
  beforeEach(async () => {
    await db.query('DELETE FROM ratchet.schedules');
    await db.query('DELETE FROM ratchet.schedule_ticks');
    await db.query('DELETE FROM ratchet.runs');
  });

  const fire = (owner = 'worker-a') =>
    fireDueSchedules({
      db: r.store.db,
      owner,
      workflows: () => ['sched-fire'],
      submit: (w, i, o) => r.submit(w, i, o),
      logger: silentLogger(),
    });
  /** Moves the database clock so that db_now() reads `at`. */
  const setDbTime = async (at: string | Date) => {
    const [row] = await db.query<{ now: Date; off: string }>(`SELECT now() AS now, offset_ms::text AS off FROM ratchet.clock`);
    await r.store.clock.setOffset(new Date(at).getTime() - row!.now.getTime());
  };
  const runs = async (schedule: string) =>
    db.query<{ key: string; state: string }>(
      `SELECT idempotency_key AS key, state FROM ratchet.runs WHERE idempotency_key LIKE $1 ORDER BY idempotency_key`,
      [`schedule:${schedule}:%`],
    );
  const ticks = async (schedule: string) =>
    (
      await db.query<{ tick: Date; outcome: string }>(
        `SELECT tick_at AS tick, outcome FROM ratchet.schedule_ticks WHERE schedule = $1 ORDER BY tick_at`,
        [schedule],
      )
    ).map((t) => `${t.tick.toISOString()} ${t.outcome}`);

  /** Walks the clock hour by hour from `from` to `to`, firing after each step; returns the runs' tick times. */
  async function walk(name: string, from: string, to: string, stepMs = 3600_000): Promise<string[]> {
    for (let t = new Date(from).getTime(); t <= new Date(to).getTime(); t += stepMs) {
      await setDbTime(new Date(t));
      await fire();
      await fire('worker-b'); // a second worker on the same clock finds nothing left to do
    }
    return (await runs(name)).map((x) => x.key.slice(`schedule:${name}:`.length));
  }

  it('Europe/Berlin 02:30 daily across spring forward: one run per day, the skipped hour fires at 03:30 CEST', async () => {
    await setDbTime('2026-03-26T12:00:00Z');
    await r.schedules.put({
      name: 'spring',
      cron: '30 2 * * *',
      timezone: 'Europe/Berlin',
      workflow: 'sched-fire',
      input: { n: 1 },
      overlap: 'allow',
    });
    expect(await walk('spring', '2026-03-26T12:30:00Z', '2026-04-01T12:30:00Z')).toEqual([
      '2026-03-27T01:30:00.000Z',
      '2026-03-28T01:30:00.000Z',
      '2026-03-29T01:30:00.000Z',
      '2026-03-30T00:30:00.000Z',
      '2026-03-31T00:30:00.000Z',
      '2026-04-01T00:30:00.000Z',
    ]);
    expect((await ticks('spring')).every((t) => t.endsWith('started'))).toBe(true);
  });

  it('Europe/Berlin 02:30 daily across fall back: one run per day, at the first 02:30 of the repeated hour', async () => {
    await setDbTime('2026-10-22T12:00:00Z');
    await r.schedules.put({
      name: 'autumn',
      cron: '30 2 * * *',
      timezone: 'Europe/Berlin',
      workflow: 'sched-fire',
      input: { n: 1 },
      overlap: 'allow',
    });
    // Steps of 20 minutes, so the clock stands inside the repeated hour twice.
    expect(await walk('autumn', '2026-10-22T12:20:00Z', '2026-10-27T12:00:00Z', 20 * 60_000)).toEqual([
      '2026-10-23T00:30:00.000Z',
      '2026-10-24T00:30:00.000Z',
      '2026-10-25T00:30:00.000Z',
      '2026-10-26T01:30:00.000Z',
      '2026-10-27T01:30:00.000Z',
    ]);
  });

  it('a schedule counts ticks from its creation: nothing earlier fires', async () => {
    await setDbTime('2026-05-01T10:30:00Z');
    await r.schedules.put({ name: 'fresh', cron: '0 * * * *', workflow: 'sched-fire', input: { n: 1 } });
    await fire();
    expect(await runs('fresh')).toEqual([]);
    expect((await r.schedules.get('fresh'))!.nextTickAt).toEqual(new Date('2026-05-01T11:00:00Z'));
  });

  it("catchUp 'none' after an outage: the latest due tick fires, the missed ones are dropped", async () => {
    await setDbTime('2026-05-01T00:00:00Z');
    await r.schedules.put({ name: 'none', cron: '0 * * * *', workflow: 'sched-fire', input: { n: 1 }, overlap: 'allow' });
    await setDbTime('2026-05-01T10:05:00Z'); // ten ticks passed with no worker
    expect(await fire()).toEqual({ started: 1, skipped: 0, missed: 9, failed: 0 });
    expect((await runs('none')).map((x) => x.key)).toEqual([tickRunKey('none', new Date('2026-05-01T10:00:00Z'))]);
    const view = (await r.schedules.get('none'))!;
    expect(view.lastTickAt).toEqual(new Date('2026-05-01T10:00:00Z'));
    expect(view.nextTickAt).toEqual(new Date('2026-05-01T11:00:00Z'));
    expect(await fire()).toEqual({ started: 0, skipped: 0, missed: 0, failed: 0 });
  });

  it('catchUp 3 after an outage: the last three missed ticks and the latest fire, oldest first', async () => {
    await setDbTime('2026-05-01T00:00:00Z');
    await r.schedules.put({ name: 'three', cron: '0 * * * *', workflow: 'sched-fire', input: { n: 1 }, overlap: 'allow', catchUp: 3 });
    await setDbTime('2026-05-01T10:05:00Z');
    expect(await fire()).toEqual({ started: 4, skipped: 0, missed: 6, failed: 0 });
    expect(await ticks('three')).toEqual(['07', '08', '09', '10'].map((h) => `2026-05-01T${h}:00:00.000Z started`));
  });

  it("overlap 'skip': a tick starts nothing while the previous run is queued or running; the next one after it ends does", async () => {
    await setDbTime('2026-05-01T00:00:30Z');
    await r.schedules.put({ name: 'skip', cron: '* * * * *', workflow: 'sched-fire', input: { n: 1 } });
    await setDbTime('2026-05-01T00:01:10Z');
    expect((await fire()).started).toBe(1);
    await setDbTime('2026-05-01T00:02:10Z');
    expect(await fire()).toEqual({ started: 0, skipped: 1, missed: 0, failed: 0 });
    const [first] = await runs('skip');
    await r.cancel((await db.query(`SELECT id FROM ratchet.runs WHERE idempotency_key = $1`, [first!.key]))[0]!.id as string);
    await setDbTime('2026-05-01T00:03:10Z');
    expect((await fire()).started).toBe(1);
    expect(await ticks('skip')).toEqual([
      '2026-05-01T00:01:00.000Z started',
      '2026-05-01T00:02:00.000Z skipped',
      '2026-05-01T00:03:00.000Z started',
    ]);
  });

  it("overlap 'skip' with catchUp: the first caught-up tick starts a run, the ones after it are skipped", async () => {
    await setDbTime('2026-05-01T00:00:00Z');
    await r.schedules.put({ name: 'skipcatch', cron: '0 * * * *', workflow: 'sched-fire', input: { n: 1 }, catchUp: 2 });
    await setDbTime('2026-05-01T05:30:00Z');
    expect(await fire()).toEqual({ started: 1, skipped: 2, missed: 2, failed: 0 });
  });

  it('racing passes (several owners at once) start one run per tick', async () => {
    await setDbTime('2026-05-01T00:00:00Z');
    await r.schedules.put({ name: 'race', cron: '*/10 * * * *', workflow: 'sched-fire', input: { n: 1 }, overlap: 'allow', catchUp: 5 });
    for (let step = 1; step <= 6; step++) {
      await setDbTime(new Date(Date.parse('2026-05-01T00:00:00Z') + step * 25 * 60_000));
      await Promise.all(['a', 'b', 'c', 'd', 'e'].map((o) => fire(`owner-${o}`)));
    }
    const got = await ticks('race');
    expect(got).toHaveLength(15); // every 10 minutes through 02:30
    expect(new Set(got).size).toBe(got.length);
    expect((await runs('race')).length).toBe(15);
  });

  it('a worker that dies holding the firing lease: another takes over after it lapses, and the tick still makes one run', async () => {
    await setDbTime('2026-05-01T00:00:00Z');
    await r.schedules.put({ name: 'lapse', cron: '0 * * * *', workflow: 'sched-fire', input: { n: 1 } });
    await setDbTime('2026-05-01T01:00:05Z');
    // The dead worker leased the schedule and even submitted the tick's run, then died before recording it.
    expect(await leaseDueSchedules(r.store.db, 'dead', ['sched-fire'], 10, FIRING_LEASE_MS)).toHaveLength(1);
    await r.submit('sched-fire', { n: 1 }, { idempotencyKey: tickRunKey('lapse', new Date('2026-05-01T01:00:00Z')) });
    expect(await fire()).toEqual({ started: 0, skipped: 0, missed: 0, failed: 0 }); // the lease is held
    await setDbTime(new Date(Date.parse('2026-05-01T01:00:05Z') + FIRING_LEASE_MS + 1000));
    expect(await fire()).toEqual({ started: 1, skipped: 0, missed: 0, failed: 0 });
    expect(await runs('lapse')).toHaveLength(1);
    expect(await ticks('lapse')).toEqual(['2026-05-01T01:00:00.000Z started']);
  });
});
