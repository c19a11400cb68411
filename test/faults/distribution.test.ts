import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Ratchet } from '../../src/engine.js';
import type { TestDatabase } from '../helpers/pg.js';
import type { PrivateRedis } from '../helpers/redis-server.js';
import type { Witness } from '../helpers/witness.js';
import { type FaultHarness, type Workers, openFaultHarness, reportAndKill } from './helpers.js';

const RUNS = 300;
const STAGES = 5;
/** Lease 3 s plus a worker's start-up: no kill comes faster than this. */
const KILL_EVERY_MS = 6000;

/**
 * Many worker processes on BullMQ while Redis is flushed every 3 s, restarted once, and
 * workers are SIGKILLed and respawned: every run succeeds, every stage's effect is applied
 * exactly once at the fenced receiver, and no stale fence is ever accepted.
 */
describe('distribution under Redis and process faults', () => {
  let db: TestDatabase;
  let witness: Witness;
  let redis: PrivateRedis;
  let r: Ratchet;
  let workers: Workers;
  let harness: FaultHarness;
  beforeAll(async () => {
    harness = await openFaultHarness('distribution', { redis: true, env: { STAGE_MS: '250' } });
    ({ db, witness, r, workers } = harness);
    redis = harness.redis!;
  });
  afterEach(reportAndKill(() => workers));
  afterAll(async () => {
    await harness.close();
  });

  const states = async () =>
    db.query<{ state: string; n: number }>(`SELECT state, count(*)::int AS n FROM ratchet.runs WHERE workflow = 'five' GROUP BY state`);

  it(`4 workers, ${RUNS} runs of ${STAGES} stages, FLUSHALL every 3 s, a Redis restart, SIGKILLs: every run succeeds, each effect once`, async () => {
    let live = await Promise.all([0, 1, 2, 3].map((i) => workers.spawn(`w${i}`)));
    const ids: string[] = [];
    for (let n = 0; n < RUNS; n++) ids.push((await r.submit('five', {})).id);

    const started = Date.now();
    let lastFlush = started;
    let lastKill = started;
    let restarted = false;
    let kills = 0;
    let flushes = 0;
    for (;;) {
      const byState = await states();
      const succeeded = byState.find((s) => s.state === 'succeeded')?.n ?? 0;
      const terminalOther = byState.filter((s) => !['succeeded', 'queued', 'running'].includes(s.state));
      expect(terminalOther, 'no run may end otherwise').toEqual([]);
      if (succeeded === RUNS) break;
      expect(Date.now() - started, `progress: ${JSON.stringify(byState)}`).toBeLessThan(240_000);
      const now = Date.now();
      if (now - lastFlush >= 3000) {
        await redis.flushAll().catch(() => {});
        lastFlush = now;
        flushes++;
      }
      if (!restarted && now - started > 5000) {
        await redis.stop();
        await new Promise((res) => setTimeout(res, 1500));
        await redis.start();
        restarted = true;
      }
      if (now - lastKill >= KILL_EVERY_MS && kills < 4) {
        const victim = Math.floor(Math.random() * live.length);
        live[victim]!.proc.kill('SIGKILL');
        await live[victim]!.exit;
        live = [...live.slice(0, victim), ...live.slice(victim + 1), await workers.spawn(`respawn${kills}`)];
        lastKill = Date.now();
        kills++;
      }
      await new Promise((res) => setTimeout(res, 250));
    }

    expect(kills).toBeGreaterThanOrEqual(2);
    expect(flushes).toBeGreaterThan(0);
    expect(restarted).toBe(true);
    const applied = await witness.appliedPerKey();
    const keys = ids.flatMap((id) => Array.from({ length: STAGES }, (_, i) => `${id}:${i + 1}:effect_step`));
    const wrong = keys.filter((k) => applied.get(k) !== 1);
    expect(wrong, 'every stage effect applied exactly once').toEqual([]);
    expect(applied.size).toBe(RUNS * STAGES);
    expect(witness.staleAccepted()).toEqual([]);
    const [stages] = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM ratchet.stages s JOIN ratchet.runs r ON r.id = s.run_id
      WHERE r.workflow = 'five' AND s.state = 'succeeded'`);
    expect(stages!.n).toBe(RUNS * STAGES);
  }, 300_000); // past the loop's own progress bound (240 s from the submits), so a stall reports its progress; it takes 43-59 s here, too near vitest's 60 s

  it('with Redis stopped for the whole test, runs still complete by polling PostgreSQL', async () => {
    await redis.stop();
    try {
      await Promise.all([workers.spawn('p1'), workers.spawn('p2')]);
      const ids: string[] = [];
      for (let n = 0; n < 20; n++) ids.push((await r.submit('five', { polling: n })).id);
      const until = Date.now() + 120_000;
      for (;;) {
        const rows = await db.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM ratchet.runs WHERE id = ANY($1::uuid[]) AND state = 'succeeded'`,
          [ids],
        );
        if (rows[0]!.n === ids.length) break;
        expect(Date.now()).toBeLessThan(until);
        await new Promise((res) => setTimeout(res, 250));
      }
      const applied = await witness.appliedPerKey();
      for (const id of ids) for (let i = 1; i <= STAGES; i++) expect(applied.get(`${id}:${i}:effect_step`)).toBe(1);
    } finally {
      await redis.start();
    }
  });
});
