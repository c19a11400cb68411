import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/logger.js';
import type { ClaimedStage, ExtendResult, Lease } from '../../src/store/index.js';
import { Attempt } from '../../src/worker/attempt.js';
import type { EventWriter } from '../../src/worker/event-writer.js';
import { LeaseKeeper, MIN_TICK_LIMIT_MS, tickLimitOf } from '../../src/worker/lease-keeper.js';
import { claimedStage } from '../helpers/claimed-stage.js';

const events = { push: () => {} } as unknown as EventWriter;
const stage = (id: string): ClaimedStage => claimedStage(id, { maxDurationMs: 60_000 });

/** The lease keeper against a fake extender (its one dependency). */
describe('LeaseKeeper', () => {
  it('extends all leases in one call per tick, and a newly held short-heartbeat lease does not wait for a long timer', async () => {
    const calls: { at: number; leases: Lease[] }[] = [];
    const extender = {
      async extend({ leases }: { owner: string; leases: Lease[] }): Promise<ExtendResult[]> {
        calls.push({ at: performance.now(), leases });
        return leases.map((l) => ({
          stageId: l.stageId,
          fence: l.fence,
          verdict: 'extended',
          state: 'running',
          leaseUntil: new Date(Date.now() + 60_000),
          dbNow: new Date(),
          confirmedUntil: performance.now() + 59_000,
        }));
      },
    };
    const keeper = new LeaseKeeper(extender, 'me', silentLogger());
    keeper.start();
    const slow = new Attempt(stage('1'), 30_000, events, silentLogger());
    keeper.add(slow);
    await new Promise((r) => setTimeout(r, 50));
    const t0 = performance.now();
    const fast = new Attempt(stage('2'), 150, events, silentLogger());
    keeper.add(fast);
    // Two ticks (about 150 ms apart), waited for rather than slept: timers run late on a loaded machine.
    for (const end = performance.now() + 10_000; calls.length < 2 && performance.now() < end; ) await new Promise((r) => setTimeout(r, 20));
    await keeper.stop();
    slow.end();
    fast.end();
    expect(calls.length).toBeGreaterThanOrEqual(2);
    expect(calls[0]!.at - t0).toBeLessThan(10_000); // the fast attempt's interval, not the slow one's 30 s
    expect(calls[0]!.leases.map((l) => l.stageId).sort()).toEqual(['1', '2']); // one statement for all
  });

  it('never extends an attempt that is finishing or ended', async () => {
    const seen: string[] = [];
    const keeper = new LeaseKeeper(
      {
        async extend({ leases }) {
          seen.push(...leases.map((l) => l.stageId));
          return [];
        },
      },
      'me',
      silentLogger(),
    );
    keeper.start();
    const a = new Attempt(stage('3'), 50, events, silentLogger());
    const b = new Attempt(stage('4'), 50, events, silentLogger());
    a.finishing = true;
    b.end();
    keeper.add(a);
    keeper.add(b);
    await new Promise((r) => setTimeout(r, 200));
    await keeper.stop();
    a.end();
    expect(seen).toEqual([]);
  });
});

describe("a tick's time limit", () => {
  it('is the least confirmed lease time left, floored at MIN_TICK_LIMIT_MS, capped at one interval', () => {
    expect(tickLimitOf([10_000 + 2_000, 10_000 + 800], 10_000, 1_000)).toBe(800);
    expect(tickLimitOf([10_000 + 5_000], 10_000, 1_000)).toBe(1_000);
    expect(tickLimitOf([10_000 + 100], 10_000, 1_000)).toBe(MIN_TICK_LIMIT_MS);
  });

  it('an attempt whose confirmed time already ran out (a blip) gives the floor, not a whole interval', () => {
    expect(tickLimitOf([10_000 - 500], 10_000, 3_000)).toBe(MIN_TICK_LIMIT_MS);
    expect(tickLimitOf([10_000 - 500, 10_000 + 2_000], 10_000, 3_000)).toBe(MIN_TICK_LIMIT_MS);
  });
});
