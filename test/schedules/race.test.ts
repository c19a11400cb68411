import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { until } from '../api/helpers.js';
import { spawnTs, type Child } from '../helpers/child.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

const DIR = fileURLToPath(new URL('../fixtures/schedule-workflows', import.meta.url));
const ROUNDS = 15;

/**
 * Three worker processes (real child processes, each with its own sweeper every 50 ms) race for
 * the same ticks: the database clock jumps to just past the next minute, so each tick becomes due for all
 * three in the same instant. Each tick makes exactly one run, and the workers run them all.
 */
describe('three worker processes racing for the same ticks', () => {
  let db: TestDatabase;
  let r: Ratchet;
  const workers: Child[] = [];
  beforeAll(async () => {
    db = await createTestDatabase('sched_race');
    r = await createRatchet({ databaseUrl: db.url, workflowsDir: DIR, logger: silentLogger() });
  });
  afterAll(async () => {
    for (const w of workers) w.proc.kill('SIGKILL');
    await Promise.all(workers.map((w) => w.exit));
    await r?.close();
    await db?.drop();
  });

  it('each tick fires once: one tick row and one run per minute, none missing, every run succeeded', async () => {
    for (const name of ['w1', 'w2', 'w3']) {
      workers.push(
        spawnTs('test/fixtures/worker-process.ts', [name], {
          DATABASE_URL: db.url,
          WORKFLOWS_DIR: DIR,
          SWEEP_INTERVAL_MS: '50',
          RATCHET_LOG_LEVEL: 'info',
        }),
      );
    }
    await Promise.all(workers.map((w) => w.line((o) => o.ready === true, 60_000)));
    /** The schedule's last decided tick (at first: when it was created, which fires no tick). */
    const lastDecided = async () =>
      (await db.query<{ t: Date }>(`SELECT last_tick_at AS t FROM ratchet.schedules WHERE name = 'minutely'`))[0]!.t.getTime();
    const started = async (tick: number) =>
      (
        await db.query(`SELECT 1 FROM ratchet.schedule_ticks WHERE schedule = 'minutely' AND tick_at = $1 AND outcome = 'started'`, [
          new Date(tick),
        ])
      ).length > 0;
    /** Per round: the tick it waits for, how long it took (real ms), how far the clock jumped; said when an assertion fails. */
    const rounds: { round: number; tick: string; ms: number; advancedMs: number }[] = [];
    for (let round = 1; round <= ROUNDS; round++) {
      const t0 = Date.now();
      // Each round makes exactly one minute due. Usually the minute the clock is in is decided already: jump to 1 s past
      // the next one (a flat 60 s jump plus the real seconds a round takes crossed two minutes once, and catchUp 'none'
      // fires only the latest). But the real clock also crosses minutes: while the workers start (the minute after the
      // schedule's creation fires on its own, with no jump) or during a round. Then the minute the clock is in is due and
      // not yet decided: that is this round's tick, with no jump (a jump would make two minutes due, one of them dropped).
      const now = (await r.store.clock.now()).getTime();
      const minute = Math.floor(now / 60_000) * 60_000;
      const jump = (await lastDecided()) >= minute;
      const tick = jump ? minute + 60_000 : minute;
      const advancedMs = jump ? minute + 61_000 - now : 0;
      if (jump) await r.store.clock.advance(advancedMs);
      await until(`tick ${round} (${new Date(tick).toISOString()})`, () => started(tick), 20_000).catch((err: Error) => {
        throw new Error(`${err.message}; worker logs: ${workers.map((w) => w.stderr().slice(-1500)).join('\n')}`);
      });
      // Each tick's run ends before the clock jumps again: a 60 s jump over a stage still running (on a loaded machine)
      // would pass its 30 s maxDuration by the database clock and fail it, which is not what this test is about.
      await until(
        `run ${round} ended`,
        async () =>
          (await db.query(`SELECT count(*)::int AS n FROM ratchet.runs WHERE workflow = 'minutely' AND state IN ('queued', 'running')`))[0]!
            .n === 0,
        30_000,
      );
      rounds.push({ round, tick: new Date(tick).toISOString(), ms: Date.now() - t0, advancedMs });
    }
    await new Promise((res) => setTimeout(res, 300)); // a late racer would have recorded a second row by now
    const ticks = await db.query<{ tick: Date; run_id: string; outcome: string }>(
      `SELECT tick_at AS tick, run_id, outcome FROM ratchet.schedule_ticks WHERE schedule = 'minutely' ORDER BY tick_at`,
    );
    const said = () =>
      `ticks: ${ticks.map((t) => `${t.tick.toISOString()} ${t.outcome}`).join(', ')}; rounds: ${JSON.stringify(rounds)}; missed or failed in the logs: ${workers
        .flatMap((w) => w.stderr().split('\n'))
        .filter((l) => /schedule_ticks_missed|schedule_tick_failed/.test(l))
        .join('\n')
        .slice(0, 3000)}`;
    // A minute the real clock crossed while the workers started, already decided when round 1 looked, fired on its own
    // (round 1 then jumped to the next): one tick before the rounds' ticks, at most. Every round's tick is there.
    const before = ticks.filter((t) => t.tick.getTime() < Date.parse(rounds[0]!.tick)).length;
    expect(before, said()).toBeLessThanOrEqual(1);
    expect(ticks, said()).toHaveLength(ROUNDS + before);
    expect(
      ticks.slice(before).map((t) => t.tick.toISOString()),
      said(),
    ).toEqual(rounds.map((x) => x.tick));
    for (let i = 1; i < ticks.length; i++) expect(ticks[i]!.tick.getTime() - ticks[i - 1]!.tick.getTime(), said()).toBe(60_000);
    expect(
      ticks.every((t) => t.outcome === 'started'),
      said(),
    ).toBe(true);
    const runs = await db.query<{ id: string; key: string }>(
      `SELECT id, idempotency_key AS key FROM ratchet.runs WHERE workflow = 'minutely' ORDER BY idempotency_key`,
    );
    expect(runs).toHaveLength(ROUNDS + before);
    expect(new Set(runs.map((x) => x.id))).toEqual(new Set(ticks.map((t) => t.run_id)));
    expect(runs.map((x) => x.key)).toEqual(ticks.map((t) => `schedule:minutely:${t.tick.toISOString()}`));
    await until(
      'runs succeeded',
      async () =>
        (await db.query(`SELECT count(*)::int AS n FROM ratchet.runs WHERE workflow = 'minutely' AND state = 'succeeded'`))[0]!.n ===
        ROUNDS + before,
      30_000,
    );
    // Who fired what (from the workers' logs): reported, not asserted (a firing transaction asked again logs twice; the
    // tick rows and runs above are the invariant); which worker wins a tick is chance.
    const firedBy = workers.map((w) => (w.stderr().match(/"event":"schedule_tick_started"/g) ?? []).length);
    console.log(`ticks fired per worker process: ${firedBy.join(', ')}`);
  });
});
