import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { laneOf } from '../../src/transport/lane.js';
import type { StageReady, Transport } from '../../src/transport/transport.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * Wake-ups are answered in batches (src/worker/worker.ts, claimLoop): every wake-up that arrived
 * before a claim began shares that claim, and is acknowledged once it was tried; a wake-up that
 * arrives while a claim runs waits for the next one. These tests hold the wake-ups in a
 * transport of their own (a stand-in for BullMQ: wake-ups are delivered when the test says, and
 * "acknowledged" when onWake resolves, after which the transport never delivers them again), and
 * poll so rarely (5 x 60 s) and sweep so rarely that a stage whose wake-up was answered without
 * a claim that could see it would not run within the test.
 */
const cls = defineToolClass({ name: 'coalesce_work', lease: '10s', heartbeat: '2s', jitter: '0ms', timeout: '20s', maxDuration: '60s' });
const ran = new Map<number, number>();
const step = defineTool({
  name: 'coalesce_step',
  description: 'counts its runs',
  class: cls,
  input: z.object({ n: z.number() }),
  output: z.object({ n: z.number() }),
  run: async (i) => {
    ran.set(i.n, (ran.get(i.n) ?? 0) + 1);
    return { n: i.n };
  },
});
const wf = defineWorkflow({ name: 'coalesce_wf', input: z.object({ n: z.number() }), steps: [{ tool: step }] });
/** Run n = 1's first stage holds its slot until the test opens the gate. */
let gate: Promise<void> = Promise.resolve();
const first = defineTool({
  name: 'coalesce_first',
  description: 'run 1 waits for the gate',
  class: cls,
  input: z.object({ n: z.number() }),
  output: z.object({ n: z.number() }),
  run: async (i) => {
    if (i.n === 1) await gate;
    return { n: i.n };
  },
});
const twoSteps = defineWorkflow({ name: 'coalesce_two', input: z.object({ n: z.number() }), steps: [{ tool: first }, { tool: step }] });

/** A fan-out of six branches after a root stage; each branch holds its slot until the test opens branchGate. */
let branchGate: Promise<void> = Promise.resolve();
const branch = defineTool({
  name: 'coalesce_branch',
  description: 'holds its slot until the gate opens',
  class: cls,
  input: z.object({ k: z.number() }),
  output: z.object({ k: z.number() }),
  run: async (i) => {
    await branchGate;
    return { k: i.k };
  },
});
const fanOut = defineWorkflow({
  name: 'coalesce_fan',
  input: z.object({ n: z.number() }),
  steps: [
    { tool: step, name: 'root' },
    ...Array.from({ length: 6 }, (_, k) => ({ tool: branch, name: `b${k}`, after: ['root'], input: () => ({ k }) })),
  ],
});

/** Holds every wake-up until delivered; each is delivered to one subscriber of its lane (the first, or the one named), at most once. */
function heldTransport() {
  const held: { lane: string; ready: StageReady }[] = [];
  const subs = new Map<string, ((r: StageReady | null) => Promise<void>)[]>();
  const transport: Transport = {
    kind: 'bullmq',
    notify(lane, ready) {
      held.push({ lane, ready });
    },
    subscribe(lane, onWake) {
      const list = subs.get(lane) ?? [];
      list.push(onWake);
      subs.set(lane, list);
      return async () => {
        list.splice(list.indexOf(onWake), 1);
      };
    },
    healthy: () => true,
    async close() {},
  };
  return {
    transport,
    held,
    /** Delivers every held wake-up at once (a burst, as BullMQ with concurrency > 1); resolves when all are acknowledged. */
    async deliverAll(to = 0): Promise<number> {
      const batch = held.splice(0);
      await Promise.all(batch.map((w) => subs.get(w.lane)?.[to]?.(w.ready)));
      return batch.length;
    },
    /** Delivers every held wake-up, each to the next subscriber of its lane in turn (BullMQ's workers compete for jobs). */
    async deliverRoundRobin(): Promise<number> {
      const batch = held.splice(0);
      await Promise.all(
        batch.map((w, i) => {
          const list = subs.get(w.lane) ?? [];
          return list[i % Math.max(1, list.length)]?.(w.ready);
        }),
      );
      return batch.length;
    },
  };
}

const RUNS = 30;
const until = async (pred: () => Promise<boolean>, ms: number) => {
  const end = Date.now() + ms;
  while (!(await pred())) {
    if (Date.now() > end) return false;
    await new Promise((r) => setTimeout(r, 25));
  }
  return true;
};

describe('wake-ups answered by one claim', () => {
  let db: TestDatabase;
  let r: Ratchet;
  let t: ReturnType<typeof heldTransport>;
  beforeEach(async () => {
    ran.clear();
    db = await createTestDatabase('wake_coalescing');
    t = heldTransport();
    r = await createRatchet({
      databaseUrl: db.url,
      workflows: [wf, twoSteps, fanOut],
      logger: silentLogger(),
      transport: t.transport,
      poolSize: 4,
    });
  });
  afterEach(async () => {
    await r.close();
    await db.drop();
  });

  const claimedOnce = async () => {
    const [s] = await db.query<{ n: number; succeeded: number; attempts: number; claims: number }>(`SELECT
      count(*)::int AS n, count(*) FILTER (WHERE state = 'succeeded')::int AS succeeded, coalesce(sum(attempt), 0)::int AS attempts,
      (SELECT count(*)::int FROM ratchet.events WHERE type IN ('job_claimed', 'lease_reclaimed')) AS claims FROM ratchet.stages`);
    return s!;
  };

  it('a burst of wake-ups whose shared claim fails: every stage is still claimed, each exactly once', async () => {
    for (let n = 0; n < RUNS; n++) await r.submit('coalesce_wf', { n });
    expect(t.held).toHaveLength(RUNS);
    // Claims fail until the burst has been answered by a failed claim.
    let failing = true;
    let failed = 0;
    const claim = r.store.claim.bind(r.store);
    r.store.claim = async (args) => {
      if (failing) {
        failed++;
        throw new Error('injected: the claim statement failed');
      }
      return claim(args);
    };
    const w = r.worker({ concurrency: 10, pollIntervalMs: 60_000, sweepIntervalMs: 600_000, fastPath: false });
    await w.start();
    expect(await t.deliverAll()).toBe(RUNS); // every wake-up acknowledged: the transport holds none any more
    expect(failed).toBeGreaterThan(0);
    expect(t.held).toHaveLength(0);
    failing = false;
    // Nothing will deliver those wake-ups again, and the poll is 5 minutes away: the worker claims again on its own.
    const done = await until(async () => (await claimedOnce()).succeeded === RUNS, 20_000);
    const s = await claimedOnce();
    await w.stop();
    expect(done).toBe(true);
    expect(s).toEqual({ n: RUNS, succeeded: RUNS, attempts: RUNS, claims: RUNS });
    expect([...ran.values()].every((c) => c === 1) && ran.size === RUNS).toBe(true);
  });

  it('a wake-up that arrives while a claim runs is answered by the next claim, not by the one that could not see its stage', async () => {
    const claim = r.store.claim.bind(r.store);
    let gate: (() => void) | null = null;
    let held = 0;
    r.store.claim = async (args) => {
      const res = await claim(args); // the claim's statement ran: what it returns was decided now
      if (held++ === 1) await new Promise<void>((res2) => (gate = res2)); // the second claim answers only later
      return res;
    };
    const w = r.worker({ concurrency: 10, pollIntervalMs: 60_000, sweepIntervalMs: 600_000, fastPath: false });
    await w.start(); // first claim (at start) finds nothing; the loop sleeps for 5 minutes
    await until(async () => held === 1, 5000);
    // Wake the loop with a wake-up of no stage; its claim finds nothing and is held before it answers.
    t.held.push({ lane: laneOf('coalesce_work', wf.hash), ready: { stageId: '0', attempt: 1 } });
    const first = t.deliverAll();
    await until(async () => gate !== null, 5000);
    // While that claim is out: a run is submitted (committed), and its wake-up arrives.
    await r.submit('coalesce_wf', { n: 1 });
    const second = t.deliverAll();
    gate!();
    await first;
    await second;
    const done = await until(async () => (await claimedOnce()).succeeded === 1, 10_000);
    const s = await claimedOnce();
    await w.stop();
    expect(done).toBe(true);
    expect(s).toEqual({ n: 1, succeeded: 1, attempts: 1, claims: 1 });
  });

  /**
   * Hand-offs (Worker.onQueued): a worker over BullMQ keeps the wake-up of a stage it queued on its
   * own lane for its own next claim. Worker A (one slot) finishes run 0's first stage while its slot
   * goes to run 1's first stage (older than run 0's second, and held by the gate): A cannot take
   * run 0's second stage, so its wake-up must reach the transport, for worker B, whose claim takes
   * every due stage it has room for: runs 2 and 3 too, whose own wake-ups were lost.
   */
  const handOffSetup = async (aPollMs: number) => {
    let open!: () => void;
    gate = new Promise<void>((res) => (open = res));
    for (let n = 0; n < 4; n++) await r.submit('coalesce_two', { n });
    t.held.splice(0); // the submits' own wake-ups are lost: runs 2 and 3 wait behind A's one slot with none
    const a = r.worker({ name: 'a', concurrency: 1, pollIntervalMs: aPollMs, sweepIntervalMs: 600_000, fastPath: false });
    await a.start();
    const stage = async (n: number, seq: number) =>
      (
        await db.query<{ id: string; state: string; owner_id: string | null }>(
          `SELECT s.id, s.state, s.owner_id FROM ratchet.stages s JOIN ratchet.runs r ON r.id = s.run_id
           WHERE (r.input ->> 'n')::int = $1 AND s.seq = $2`,
          [n, seq],
        )
      )[0];
    expect(await until(async () => (await stage(0, 2))?.state === 'queued' && (await stage(1, 1))?.state === 'running', 10_000)).toBe(true);
    return { a, open, stage };
  };

  it('a hand-off the worker cannot claim (its slots are taken by older stages) goes to the transport, and another worker runs it once', async () => {
    const { a, open, stage } = await handOffSetup(300); // A holds a hand-off one poll interval (300 ms) at most
    const s2 = (await stage(0, 2))!;
    expect(await until(async () => t.held.some((h) => h.ready.stageId === s2.id), 10_000)).toBe(true);
    expect(t.held).toHaveLength(1);
    const b = r.worker({ name: 'b', concurrency: 5, pollIntervalMs: 60_000, sweepIntervalMs: 600_000, fastPath: false });
    await b.start();
    await t.deliverAll(1); // to B
    expect(await until(async () => (await stage(0, 2))?.state === 'succeeded', 10_000)).toBe(true);
    expect((await stage(0, 2))!.owner_id).toBe(b.owner);
    open();
    expect(await until(async () => (await claimedOnce()).succeeded === 8, 10_000)).toBe(true);
    await a.stop();
    await b.stop();
    expect(await claimedOnce()).toEqual({ n: 8, succeeded: 8, attempts: 8, claims: 8 });
  });

  it('a hand-off the worker has no room for goes to the transport at once, not after the hold (a fan-out does not wait for a busy worker)', async () => {
    const { a, open, stage } = await handOffSetup(60_000); // A would hold its hand-offs for a minute
    const s2 = (await stage(0, 2))!;
    // A's claim after run 0's first stage came back full (run 1's gated stage is older): the hand-off is passed on now.
    expect(await until(async () => t.held.some((h) => h.ready.stageId === s2.id), 10_000)).toBe(true);
    const b = r.worker({ name: 'b', concurrency: 5, pollIntervalMs: 60_000, sweepIntervalMs: 600_000, fastPath: false });
    await b.start();
    await t.deliverAll(1); // to B
    expect(await until(async () => (await stage(0, 2))?.state === 'succeeded', 10_000)).toBe(true);
    open(); // run 1's first stage finishes as A stops: its second stage reaches the transport too
    await a.stop({ graceMs: 5000 });
    const s12 = (await stage(1, 2))!;
    expect(await until(async () => s12.state !== 'queued' || t.held.some((h) => h.ready.stageId === s12.id), 10_000)).toBe(true);
    await t.deliverAll(0); // A unsubscribed: B is the only subscriber
    expect(await until(async () => (await claimedOnce()).succeeded === 8, 10_000)).toBe(true);
    await b.stop();
    expect(await claimedOnce()).toEqual({ n: 8, succeeded: 8, attempts: 8, claims: 8 });
  });

  it("a busy worker's fan-out reaches every idle worker: one wake-up per live worker, not one per branch it cannot take", async () => {
    let open!: () => void;
    branchGate = new Promise<void>((res) => (open = res));
    const b = r.worker({ name: 'b', concurrency: 3, pollIntervalMs: 60_000, sweepIntervalMs: 600_000, fastPath: false });
    const c = r.worker({ name: 'c', concurrency: 3, pollIntervalMs: 60_000, sweepIntervalMs: 600_000, fastPath: false });
    await b.start();
    await c.start();
    // B and C announce themselves first, so A's first sweep counts three live workers.
    const announced = async () => (await db.query<{ n: number }>('SELECT count(*)::int AS n FROM ratchet.workers'))[0]!.n;
    expect(await until(async () => (await announced()) === 2, 10_000)).toBe(true);
    const a = r.worker({ name: 'a', concurrency: 1, pollIntervalMs: 60_000, sweepIntervalMs: 600_000, fastPath: false });
    await a.start();
    expect(await until(async () => a.dbLanes.peers === 3, 10_000)).toBe(true);
    await r.submit('coalesce_fan', { n: 0 });
    await t.deliverAll(2); // the submit's wake-up, to A (subscribers: B, C, A): A runs the root, takes one branch, passes the others on
    // Five branches A has no room for, three live workers: three wake-ups (a worker with room claims all it can).
    expect(await until(async () => t.held.length > 0, 10_000)).toBe(true);
    expect(t.held.map((h) => h.lane)).toEqual(Array(3).fill(t.held[0]!.lane)); // one passOnHanded call sends them together
    const running = async () =>
      (await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM ratchet.stages WHERE name LIKE 'b%' AND state = 'running'`))[0]!.n;
    // Round robin: B, C, then A (full: answered without a claim). While every branch holds its slot, the six run at
    // once on A (1) and B and C (the other five, 3 slots each): B and C learn of them from the wake-ups only.
    const all = await until(async () => {
      await t.deliverRoundRobin();
      return (await running()) === 6;
    }, 10_000);
    open();
    expect(all).toBe(true);
    expect(await until(async () => (await claimedOnce()).succeeded === 7, 10_000)).toBe(true);
    await Promise.all([a.stop(), b.stop(), c.stop()]);
    expect(await claimedOnce()).toEqual({ n: 7, succeeded: 7, attempts: 7, claims: 7 });
  });

  it('hand-offs past the cap are not lost: with every wake-up discarded, one worker with one slot runs all six branches, each once', async () => {
    branchGate = Promise.resolve();
    await r.submit('coalesce_fan', { n: 0 });
    const a = r.worker({ name: 'a', concurrency: 1, pollIntervalMs: 60_000, sweepIntervalMs: 600_000, fastPath: false });
    await a.start(); // its first claim takes the root; from then on only its freed slot brings it back (the polls are 5 minutes apart)
    const done = await until(async () => {
      t.held.splice(0); // every wake-up lost
      return (await claimedOnce()).succeeded === 7;
    }, 10_000);
    await a.stop();
    expect(done).toBe(true);
    expect(await claimedOnce()).toEqual({ n: 7, succeeded: 7, attempts: 7, claims: 7 });
  });
});
