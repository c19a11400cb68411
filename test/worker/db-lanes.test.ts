import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { InvalidInputError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import type { Row } from '../../src/store/db.js';
import { DbLanes, dbLanesFromEnv } from '../../src/worker/db-lanes.js';
import type { Worker } from '../../src/worker/worker.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * Statement lanes (issue 14): the claim and finish statements the live workers of a database keep
 * in flight together, shared out among them. The gate itself, then two workers on real PostgreSQL
 * that learn of each other from ratchet.workers: neither ever has more of its claims and finishes
 * in flight than its share, and every run still succeeds.
 */
describe('DbLanes', () => {
  it("a worker's share is the total over the live workers, at least one; Infinity is no limit", () => {
    const l = new DbLanes(4);
    expect(l.width).toBe(4);
    l.setPeers(2);
    expect(l.width).toBe(2);
    l.setPeers(3);
    expect(l.width).toBe(1);
    l.setPeers(40);
    expect(l.width).toBe(1);
    l.setPeers(0);
    expect(l.width).toBe(4);
    const open = new DbLanes(Infinity);
    open.setPeers(8);
    expect(open.width).toBe(Infinity);
    expect(new DbLanes(0).width).toBe(Infinity);
  });

  it('waiters get lanes oldest first, a release counts once, and a smaller share holds new statements until enough ended', async () => {
    const l = new DbLanes(2);
    const a = (await l.acquire())!;
    const b = (await l.acquire())!;
    const order: string[] = [];
    const c = l.acquire().then((rel) => (order.push('c'), rel!));
    const d = l.acquire().then((rel) => (order.push('d'), rel!));
    await new Promise((r) => setTimeout(r, 5));
    expect(order).toEqual([]);
    expect(l.inFlight).toBe(2);
    l.setPeers(2); // share 1: two in flight already, none more until one is left
    a();
    a(); // a second release of the same lane is nothing
    await new Promise((r) => setTimeout(r, 5));
    expect(order).toEqual([]);
    expect(l.inFlight).toBe(1);
    b();
    const relC = await c;
    expect(order).toEqual(['c']);
    expect(l.inFlight).toBe(1);
    l.setPeers(1); // share 2 again: d goes now, beside c
    const relD = await d;
    expect(order).toEqual(['c', 'd']);
    expect(l.inFlight).toBe(2);
    relC();
    relD();
    expect(l.inFlight).toBe(0);
  });

  it('a wait ended by its signal takes no lane and leaves the others their turn', async () => {
    const l = new DbLanes(1);
    const a = (await l.acquire())!;
    const stop = new AbortController();
    const aborted = l.acquire(stop.signal);
    const next = l.acquire();
    stop.abort();
    expect(await aborted).toBeNull();
    a();
    const rel = await next;
    expect(l.inFlight).toBe(1);
    rel!();
    expect(await l.acquire(stop.signal)).toBeNull(); // already aborted: no wait, no lane
    expect(l.inFlight).toBe(0);
    expect(l.tryAcquire()).not.toBeNull();
    expect(l.tryAcquire()).toBeNull();
  });

  it('RATCHET_DB_LANES: a whole number, 0 for no limit; anything else is refused with its name', () => {
    expect(dbLanesFromEnv({})).toBeUndefined();
    expect(dbLanesFromEnv({ RATCHET_DB_LANES: ' 6 ' })).toBe(6);
    expect(dbLanesFromEnv({ RATCHET_DB_LANES: '0' })).toBe(Infinity);
    for (const bad of ['-1', '2.5', 'four', '1e3']) {
      expect(() => dbLanesFromEnv({ RATCHET_DB_LANES: bad })).toThrow(InvalidInputError);
    }
  });
});

const cls = defineToolClass({ name: 'lanes_cls', lease: '20s', heartbeat: '5s', jitter: '100ms', timeout: '30s', maxDuration: '60s' });
const empty = z.object({}).passthrough();
const step = defineTool({
  name: 'lanes_step',
  description: 'a short piece of work',
  class: cls,
  input: empty,
  output: empty,
  run: async () => {
    await new Promise((r) => setTimeout(r, 1));
    return {};
  },
});
const limited = defineToolClass({
  name: 'lanes_limited',
  concurrency: 2,
  lease: '20s',
  heartbeat: '5s',
  jitter: '100ms',
  timeout: '30s',
  maxDuration: '60s',
});
const limitedStep = defineTool({
  name: 'lanes_limited_step',
  description: 'work of a class with a limit',
  class: limited,
  input: empty,
  output: empty,
  run: async () => ({}),
});
const workflows = [
  defineWorkflow({ name: 'lanes_limited', input: empty, steps: [{ tool: limitedStep }] }),
  defineWorkflow({
    name: 'lanes',
    input: empty,
    steps: [
      { name: 'a', tool: step },
      { name: 'b', tool: step },
      { name: 'c', tool: step },
    ],
  }),
];
const RUNS = 150;
const HOT = /^ratchet_(claim|finish)/;

describe('statement lanes on PostgreSQL', () => {
  let db: TestDatabase;
  let r: Ratchet;
  /** Claims and finishes in flight now, by owner (a claim's and a finish's first parameter), and the most seen. */
  const inFlight = new Map<string, number>();
  const most = new Map<string, number>();
  let mostTogether = 0;
  beforeAll(async () => {
    db = await createTestDatabase('db_lanes');
    r = await createRatchet({ databaseUrl: db.url, workflows, logger: silentLogger(), poolSize: 12 });
    const store = r.store.db as unknown as { query: (text: string, params?: readonly unknown[], name?: string) => Promise<Row[]> };
    const query = store.query.bind(store);
    store.query = async (text, params, name) => {
      if (!name || !HOT.test(name)) return query(text, params, name);
      const owner = String(params?.[0]);
      const n = (inFlight.get(owner) ?? 0) + 1;
      inFlight.set(owner, n);
      most.set(owner, Math.max(most.get(owner) ?? 0, n));
      mostTogether = Math.max(
        mostTogether,
        [...inFlight.values()].reduce((a, b) => a + b, 0),
      );
      try {
        return await query(text, params, name);
      } finally {
        inFlight.set(owner, inFlight.get(owner)! - 1);
      }
    };
  });
  afterAll(async () => {
    await r?.close();
    await db?.drop();
  });

  async function drain(workers: Worker[]): Promise<void> {
    const ids: string[] = [];
    for (let i = 0; i < RUNS; i++) ids.push((await r.submit('lanes', { i })).id);
    for (let i = 0; i < 1200; i++) {
      const [row] = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM ratchet.runs WHERE state <> 'succeeded'`);
      if (row!.n === 0) break;
      await new Promise((res) => setTimeout(res, 25));
    }
    await Promise.all(workers.map((w) => w.stop({ graceMs: 1000 })));
    const [done] = await db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM ratchet.runs WHERE state = 'succeeded' AND id = ANY($1::uuid[])`,
      [ids],
    );
    expect(done!.n).toBe(RUNS);
    // Nothing doubled by a wait for a lane: one attempt and one success per stage.
    const [once] = await db.query<{ stages: number; attempts: number; succeeded: number }>(
      `SELECT count(*)::int AS stages, sum(s.attempt)::int AS attempts,
              (SELECT count(*)::int FROM ratchet.events e WHERE e.run_id = ANY($1::uuid[]) AND e.type = 'stage_succeeded') AS succeeded
       FROM ratchet.stages s WHERE s.run_id = ANY($1::uuid[])`,
      [ids],
    );
    expect(once).toEqual({ stages: RUNS * 3, attempts: RUNS * 3, succeeded: RUNS * 3 });
  }

  async function twoWorkers(dbLanes: number): Promise<Worker[]> {
    // Fast path off: every stage is claimed on its own, so claims and finishes of both workers overlap.
    const ws = [0, 1].map(() => r.worker({ dbLanes, concurrency: 20, fastPath: false, pollIntervalMs: 20, sweepIntervalMs: 100 }));
    for (const w of ws) await w.start();
    for (let i = 0; i < 200 && ws.some((w) => w.dbLanes.width !== Math.max(1, Math.floor(dbLanes / 2))); i++) {
      await new Promise((res) => setTimeout(res, 10));
    }
    most.clear();
    mostTogether = 0;
    return ws;
  }

  it('two live workers sharing 2 lanes: each has at most one claim or finish in flight, and every run succeeds', async () => {
    const ws = await twoWorkers(2);
    expect(ws.map((w) => w.dbLanes.width)).toEqual([1, 1]);
    await drain(ws);
    expect(most.size).toBe(2);
    expect([...most.values()]).toEqual([1, 1]);
    expect(mostTogether).toBeLessThanOrEqual(2);
  });

  it('without a limit the same load keeps more in flight (what the lanes hold back)', async () => {
    const ws = await twoWorkers(Infinity as number);
    await drain(ws);
    expect(Math.max(...most.values())).toBeGreaterThan(1);
  });

  it('stop ends a claim loop waiting for a lane at once, the lane still held elsewhere', async () => {
    const w = r.worker({ dbLanes: 1, fastPath: false, pollIntervalMs: 20, sweepIntervalMs: 100 });
    const lanes = (w as unknown as { lanes: DbLanes }).lanes;
    const held = (await lanes.acquire())!; // the worker's only lane, held by the test
    await r.submit('lanes', { waiting: true });
    await w.start();
    await new Promise((res) => setTimeout(res, 100)); // its claim loop now waits for the lane
    const began = Date.now();
    await w.stop({ graceMs: 0 });
    const took = Date.now() - began;
    held();
    expect(took).toBeLessThan(5000); // not a timing goal: without the abort, stop waits for the lane for good
    expect(lanes.inFlight).toBe(0);
  });

  it('dbLanes 0 is no limit; a claim of a class with limits takes no lane (its finish waits for one)', async () => {
    expect(r.worker({ dbLanes: 0 }).dbLanes.width).toBe(Infinity);
    const w = r.worker({ dbLanes: 1, classes: ['lanes_limited'], pollIntervalMs: 20, sweepIntervalMs: 100 });
    const lanes = (w as unknown as { lanes: DbLanes }).lanes;
    const held = (await lanes.acquire())!;
    const { id } = await r.submit('lanes_limited', {});
    await w.start();
    try {
      let claimed = 0;
      for (let i = 0; i < 200 && claimed === 0; i++) {
        await new Promise((res) => setTimeout(res, 20));
        [{ n: claimed }] = (await db.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM ratchet.events WHERE run_id = $1 AND type = 'job_claimed'`,
          [id],
        )) as [{ n: number }];
      }
      expect(claimed).toBe(1); // claimed while the worker's only lane is held
      held();
      for (let i = 0; i < 200; i++) {
        const run = await r.getRun(id);
        if (run?.state === 'succeeded') break;
        await new Promise((res) => setTimeout(res, 20));
      }
      expect((await r.getRun(id))?.state).toBe('succeeded');
    } finally {
      held();
      await w.stop({ graceMs: 1000 });
    }
  });
});
