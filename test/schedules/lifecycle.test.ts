import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { defineSchedule } from '../../src/schedules/define.js';
import { FAILURE_BACKOFF_MS, FIRING_LEASE_MS, fireDueSchedules, type SubmitRun } from '../../src/schedules/fire.js';
import { syncCodeSchedules } from '../../src/schedules/service.js';
import { finishFiring, leaseDueSchedules, recordTick } from '../../src/store/schedules.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

const cls = defineToolClass({ name: 'sched-life', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '2s', maxDuration: '10s' });
const echo = defineTool({
  name: 'sched_life_echo',
  description: 'echo',
  class: cls,
  input: z.object({ n: z.number() }),
  output: z.object({ n: z.number() }),
  run: async (i) => i,
});
const wf = defineWorkflow({ name: 'sched-life', input: z.object({ n: z.number() }), steps: [{ tool: echo }] });

/** Replaces, failures, the code sync and priorities of schedules, on PostgreSQL with the movable clock; passes called by hand. */
describe('schedules: replace, failures, code sync, priority', () => {
  let db: TestDatabase;
  let r: Ratchet;
  beforeAll(async () => {
    db = await createTestDatabase('sched_life');
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

  const plainSubmit: SubmitRun = (w, i, o) => r.submit(w, i, o);
  const fire = (owner = 'worker-a', submit: SubmitRun = plainSubmit) =>
    fireDueSchedules({ db: r.store.db, owner, workflows: () => ['sched-life'], submit, logger: silentLogger() });
  const setDbTime = async (at: string | Date) => {
    const [row] = await db.query<{ now: Date }>(`SELECT now() AS now`);
    await r.store.clock.setOffset(new Date(at).getTime() - row!.now.getTime());
  };
  const runKeys = async (schedule: string) =>
    (
      await db.query<{ key: string }>(`SELECT idempotency_key AS key FROM ratchet.runs WHERE idempotency_key LIKE $1 ORDER BY 1`, [
        `schedule:${schedule}:%`,
      ])
    ).map((x) => x.key.slice(`schedule:${schedule}:`.length));

  it('a replace that changes the cron fires no tick of the past: the next tick counts from now', async () => {
    await setDbTime('2026-05-01T00:00:00Z');
    await r.schedules.put({ name: 'recron', cron: '0 * * * *', workflow: 'sched-life', input: { n: 1 }, overlap: 'allow', catchUp: 5 });
    await setDbTime('2026-05-01T05:40:00Z'); // an outage: no pass ran
    const { schedule } = await r.schedules.put({
      name: 'recron',
      cron: '*/15 * * * *',
      workflow: 'sched-life',
      input: { n: 1 },
      overlap: 'allow',
      catchUp: 5,
    });
    expect(schedule.nextTickAt).toEqual(new Date('2026-05-01T05:45:00Z'));
    // The database clock runs on from the moved time: last_tick_at is the replace's now.
    expect(schedule.lastTickAt.getTime()).toBeGreaterThanOrEqual(Date.parse('2026-05-01T05:40:00Z'));
    expect(schedule.lastTickAt.getTime()).toBeLessThan(Date.parse('2026-05-01T05:45:00Z'));
    expect(await fire()).toEqual({ started: 0, skipped: 0, missed: 0, failed: 0 });
    await setDbTime('2026-05-01T05:46:00Z');
    expect((await fire()).started).toBe(1);
    expect(await runKeys('recron')).toEqual(['2026-05-01T05:45:00.000Z']);
  });

  it('a replace that changes only the time zone counts from now too; one that keeps cron and zone keeps its due ticks', async () => {
    await setDbTime('2026-05-01T00:00:00Z');
    await r.schedules.put({ name: 'retz', cron: '0 * * * *', workflow: 'sched-life', input: { n: 1 }, overlap: 'allow', catchUp: 2 });
    await setDbTime('2026-05-01T03:10:00Z');
    await r.schedules.put({
      name: 'retz',
      cron: '0 * * * *',
      timezone: 'Asia/Kolkata',
      workflow: 'sched-life',
      input: { n: 1 },
      overlap: 'allow',
      catchUp: 2,
    });
    expect((await r.schedules.get('retz'))!.nextTickAt).toEqual(new Date('2026-05-01T03:30:00Z')); // hh:00 in UTC+05:30
    expect((await fire()).started).toBe(0);

    await r.schedules.put({ name: 'keep', cron: '0 * * * *', workflow: 'sched-life', input: { n: 1 }, overlap: 'allow', catchUp: 2 });
    await setDbTime('2026-05-01T06:10:00Z');
    await r.schedules.put({ name: 'keep', cron: '0 * * * *', workflow: 'sched-life', input: { n: 2 }, overlap: 'allow', catchUp: 2 });
    await fire();
    expect(await runKeys('keep')).toEqual(['04', '05', '06'].map((h) => `2026-05-01T${h}:00:00.000Z`));
  });

  it('a pass that ends after a concurrent replace changed the cron does not write the old next tick', async () => {
    await setDbTime('2026-05-01T00:00:00Z');
    await r.schedules.put({ name: 'race', cron: '0 * * * *', workflow: 'sched-life', input: { n: 1 }, overlap: 'allow' });
    await setDbTime('2026-05-01T01:05:00Z');
    const [leased] = await leaseDueSchedules(r.store.db, 'w', ['sched-life'], 10, FIRING_LEASE_MS);
    expect(leased!.name).toBe('race');
    const tick = new Date('2026-05-01T01:00:00Z');
    const run = await r.submit('sched-life', { n: 1 }, { idempotencyKey: `schedule:race:${tick.toISOString()}` });
    expect(await recordTick(r.store.db, 'race', 'w', tick, 'started', run.id)).toBe(true);
    // The replace lands between the tick's record and the end of the pass.
    await r.schedules.put({ name: 'race', cron: '*/10 * * * *', workflow: 'sched-life', input: { n: 1 }, overlap: 'allow' });
    expect((await r.schedules.get('race'))!.nextTickAt).toEqual(new Date('2026-05-01T01:10:00Z'));
    const oldNext = new Date('2026-05-01T02:00:00Z');
    await finishFiring(r.store.db, 'race', 'w', {
      latest: tick,
      next: oldNext,
      cron: leased!.cron,
      timezone: leased!.timezone,
      backoffMs: FAILURE_BACKOFF_MS,
    });
    const after = (await r.schedules.get('race'))!;
    expect(after.nextTickAt).not.toEqual(oldNext);
    expect(after.nextTickAt!.getTime()).toBeLessThanOrEqual(Date.parse('2026-05-01T01:10:00Z'));
    await setDbTime('2026-05-01T01:11:00Z');
    await fire();
    expect(await runKeys('race')).toEqual(['2026-05-01T01:00:00.000Z', '2026-05-01T01:10:00.000Z']);
    expect((await r.schedules.get('race'))!.nextTickAt).toEqual(new Date('2026-05-01T01:20:00Z'));
  });

  it('a submit that fails after a concurrent replace moved the schedule on: the pass still frees its firing lease', async () => {
    await setDbTime('2026-05-01T00:00:00Z');
    await r.schedules.put({ name: 'replaced-mid', cron: '0 * * * *', workflow: 'sched-life', input: { n: 1 }, overlap: 'allow' });
    await setDbTime('2026-05-01T01:05:00Z');
    let calls = 0;
    const submit: SubmitRun = async () => {
      calls++;
      // The replace lands while the submit is on its way: a new cron counts from now (last_tick_at moves past the tick).
      await r.schedules.put({ name: 'replaced-mid', cron: '*/10 * * * *', workflow: 'sched-life', input: { n: 1 }, overlap: 'allow' });
      throw Object.assign(new Error('boom'), { code: 'boom' });
    };
    expect((await fire('a', submit)).failed).toBe(1);
    expect(calls).toBe(1);
    // The failed tick was refused (its schedule moved on) and the pass ended: the lease is free, no back-off, no 'failed' row.
    const [row] = await db.query<{ firing_owner: string | null; firing_until: Date | null }>(
      `SELECT firing_owner, firing_until FROM ratchet.schedules WHERE name = 'replaced-mid'`,
    );
    expect(row).toEqual({ firing_owner: null, firing_until: null });
    expect(await r.schedules.ticks('replaced-mid')).toEqual([]);
    // Another worker fires the new expression's next tick at once, not after the ~60 s lease lapses.
    await setDbTime('2026-05-01T01:10:30Z');
    expect((await fire('b')).started).toBe(1);
    expect(await runKeys('replaced-mid')).toEqual(['2026-05-01T01:10:00.000Z']);
  });

  it("a failing submit: a 'failed' tick with the error, the lease freed, a growing back-off, then the tick starts", async () => {
    await setDbTime('2026-05-01T00:00:00Z');
    await r.schedules.put({ name: 'flaky', cron: '0 * * * *', workflow: 'sched-life', input: { n: 1 } });
    await setDbTime('2026-05-01T01:00:05Z');
    let failing = true;
    const submit: SubmitRun = async (w, i, o) => {
      if (failing) throw Object.assign(new Error('the database refused: boom'), { code: 'boom' });
      return r.submit(w, i, o);
    };
    expect(await fire('a', submit)).toEqual({ started: 0, skipped: 0, missed: 0, failed: 1 });
    let view = (await r.schedules.get('flaky'))!;
    expect(view.failures).toBe(1);
    expect(view.lastError).toEqual({ code: 'boom', message: 'the database refused: boom' });
    const backoff1 = view.backoffUntil!.getTime() - Date.parse('2026-05-01T01:00:05Z');
    expect(backoff1).toBeGreaterThanOrEqual(FAILURE_BACKOFF_MS.first);
    expect(backoff1).toBeLessThan(FAILURE_BACKOFF_MS.first * 2);
    expect(view.lastTickAt.getTime()).toBeLessThan(Date.parse('2026-05-01T01:00:00Z')); // the tick is not decided
    expect(view.nextTickAt).toEqual(new Date('2026-05-01T01:00:00Z'));
    const [lease] = await db.query(`SELECT firing_owner FROM ratchet.schedule_ticks t JOIN ratchet.schedules s ON s.name = t.schedule`);
    expect(lease!.firing_owner).toBeNull();
    let ticks = await r.schedules.ticks('flaky');
    expect(ticks.map((t) => [t.tickAt.toISOString(), t.outcome, t.error?.code])).toEqual([['2026-05-01T01:00:00.000Z', 'failed', 'boom']]);

    // Backing off: another worker finds nothing to do; after the back-off it fails again and waits twice as long.
    expect(await fire('b', submit)).toEqual({ started: 0, skipped: 0, missed: 0, failed: 0 });
    await setDbTime(new Date(Date.parse('2026-05-01T01:00:05Z') + FAILURE_BACKOFF_MS.first + 1000));
    expect((await fire('b', submit)).failed).toBe(1);
    view = (await r.schedules.get('flaky'))!;
    expect(view.failures).toBe(2);
    const backoff2 = view.backoffUntil!.getTime() - (Date.parse('2026-05-01T01:00:05Z') + FAILURE_BACKOFF_MS.first + 1000);
    expect(backoff2).toBeGreaterThanOrEqual(2 * FAILURE_BACKOFF_MS.first);
    expect(backoff2).toBeLessThan(3 * FAILURE_BACKOFF_MS.first);

    failing = false;
    await setDbTime('2026-05-01T01:05:00Z');
    expect((await fire('c', submit)).started).toBe(1);
    view = (await r.schedules.get('flaky'))!;
    expect([view.failures, view.lastError, view.backoffUntil]).toEqual([0, null, null]);
    expect(view.nextTickAt).toEqual(new Date('2026-05-01T02:00:00Z'));
    ticks = await r.schedules.ticks('flaky');
    expect(ticks).toHaveLength(1);
    expect(ticks[0]!.outcome).toBe('started');
    expect(ticks[0]!.runId).not.toBeNull();
    expect(ticks[0]!.error?.code).toBe('boom'); // the failures before it stay readable
  });

  it('the code sync: only code schedules; unchanged ones untouched; API ones never; removed ones retired, then back', async () => {
    await setDbTime('2026-05-01T00:00:00Z');
    const a = defineSchedule({ name: 'code-a', cron: '0 * * * *', workflow: 'sched-life', input: { n: 1 } });
    const b = defineSchedule({ name: 'code-b', cron: '0 * * * *', workflow: 'sched-life', input: { n: 1 }, overlap: 'allow' });
    expect((await syncCodeSchedules(r.store.db, [a, b], ['sched-life'])).written).toEqual(['code-a', 'code-b']);
    const before = (await r.schedules.get('code-b'))!.updatedAt;
    // An API edit of code-a takes it over: the code sync leaves it alone from then on.
    await r.schedules.put({ name: 'code-a', cron: '*/30 * * * *', workflow: 'sched-life', input: { n: 42 } });
    await setDbTime('2026-05-01T00:10:00Z');
    const again = await syncCodeSchedules(r.store.db, [a, b], ['sched-life']);
    expect(again).toEqual({ written: [], keptApi: ['code-a'], retired: [] });
    const apiA = (await r.schedules.get('code-a'))!;
    expect([apiA.source, apiA.cron, apiA.input]).toEqual(['api', '*/30 * * * *', { n: 42 }]);
    expect((await r.schedules.get('code-b'))!.updatedAt).toEqual(before); // same definition: not written

    // code-b leaves the files: retired (kept), fires nothing; code-a (API) untouched; another deployment's workflows untouched.
    expect((await syncCodeSchedules(r.store.db, [], ['other-workflow'])).retired).toEqual([]);
    expect((await syncCodeSchedules(r.store.db, [], ['sched-life'])).retired).toEqual(['code-b']);
    expect((await r.schedules.get('code-b'))!.retiredAt).not.toBeNull();
    expect((await r.schedules.get('code-a'))!.retiredAt).toBeNull();
    await setDbTime('2026-05-01T03:05:00Z');
    await fire();
    expect(await runKeys('code-b')).toEqual([]);
    expect((await runKeys('code-a')).length).toBe(1);

    // Defined again: back, counting from now (as a changed cron does): no tick of the time it was retired fires.
    expect((await syncCodeSchedules(r.store.db, [b], ['sched-life'])).written).toEqual(['code-b']);
    const back = (await r.schedules.get('code-b'))!;
    expect(back.retiredAt).toBeNull();
    expect(back.lastTickAt.getTime()).toBeGreaterThanOrEqual(Date.parse('2026-05-01T03:05:00Z')); // now, not its retirement
    expect(back.nextTickAt).toEqual(new Date('2026-05-01T04:00:00Z'));
    await fire();
    expect(await runKeys('code-b')).toEqual([]);
    await setDbTime('2026-05-01T04:01:00Z');
    await fire();
    expect(await runKeys('code-b')).toEqual(['2026-05-01T04:00:00.000Z']);
  });

  it('a schedule sets the priority of the runs it starts (API and defineSchedule); without one, the workflow default', async () => {
    await setDbTime('2026-05-01T00:00:00Z');
    const { schedule } = await r.schedules.put({ name: 'pri', cron: '0 * * * *', workflow: 'sched-life', input: { n: 1 }, priority: 7 });
    expect(schedule.priority).toBe(7);
    await syncCodeSchedules(
      r.store.db,
      [defineSchedule({ name: 'pri-code', cron: '0 * * * *', workflow: 'sched-life', input: { n: 1 }, priority: -3 })],
      ['sched-life'],
    );
    await r.schedules.put({ name: 'pri-none', cron: '0 * * * *', workflow: 'sched-life', input: { n: 1 } });
    await setDbTime('2026-05-01T01:00:05Z');
    expect((await fire()).started).toBe(3);
    const rows = await db.query<{ key: string; priority: number }>(
      `SELECT split_part(idempotency_key, ':', 2) AS key, priority FROM ratchet.runs ORDER BY 1`,
    );
    expect(rows).toEqual([
      { key: 'pri', priority: 7 },
      { key: 'pri-code', priority: -3 },
      { key: 'pri-none', priority: 0 },
    ]);
    await expect(
      r.schedules.put({ name: 'pri-bad', cron: '0 * * * *', workflow: 'sched-life', input: { n: 1 }, priority: 1000 }),
    ).rejects.toMatchObject({ code: 'invalid_input' });
    expect(await r.schedules.get('pri-bad')).toBeNull();
  });
});
