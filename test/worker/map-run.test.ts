import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import { TransientError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import type { Worker } from '../../src/worker/worker.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startWitness, type Witness } from '../helpers/witness.js';

/**
 * Map steps (issue 11), on PostgreSQL with four workers: a list of 300 items with maxParallel 5.
 * Checked from the stage rows, the tools' own running intervals and the fenced receiver, never from
 * timings: at no instant do more than 5 items of the run run (their intervals, each inside its lease), every item's effect is applied once at the receiver under its
 * stable key (run:step:index), and the map's output is the items' outputs in item order.
 * Also: an empty list gives [], and a list over maxItems fails the step with map_too_large.
 */
const items = defineToolClass({
  name: 'map_items',
  lease: '5s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '20s',
  maxDuration: '60s',
  retry: { maxAttempts: 3, backoff: { initial: '50ms', jitter: 0 } },
});
let witnessUrl = '';
/** Each item attempt's running interval, taken inside the tool (so inside its lease: after the claim committed, before the finish). */
const running: { v: number; attempt: number; start: number; end: number }[] = [];
const list = defineTool({
  name: 'list',
  description: 'a list of n numbers',
  class: items,
  input: z.object({ n: z.number() }),
  output: z.object({ values: z.array(z.number()) }),
  run: async ({ n }) => ({ values: Array.from({ length: n }, (_, i) => i) }),
});
const square = defineTool({
  name: 'square',
  description: 'squares a number, with one fenced effect',
  class: items,
  input: z.object({ v: z.number() }),
  output: z.object({ sq: z.number() }),
  run: async ({ v }, ctx) => {
    const start = performance.now();
    await new Promise((r) => setTimeout(r, 5 + (v % 7) * 3));
    ctx.beginEffect(`sq-${v}`);
    const res = await fetch(`${witnessUrl}/effect`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': ctx.idempotencyKey, 'x-execution-fence': ctx.fence },
      body: JSON.stringify({ v }),
      signal: ctx.signal,
    });
    if (res.status >= 500) throw new TransientError(`receiver ${res.status}`);
    running.push({ v, attempt: ctx.attempt, start, end: performance.now() });
    return { sq: v * v };
  },
});
const total = defineTool({
  name: 'total',
  description: 'sums the squares',
  class: items,
  input: z.object({ parts: z.array(z.object({ sq: z.number() })) }),
  output: z.object({ count: z.number(), ordered: z.boolean() }),
  run: async ({ parts }) => ({ count: parts.length, ordered: parts.every((p, i) => p.sq === i * i) }),
});
const squares = (maxItems?: number) =>
  defineWorkflow({
    name: maxItems ? 'squares_bounded' : 'squares',
    input: z.object({ n: z.number() }),
    steps: [
      { tool: list },
      {
        name: 'each',
        map: {
          items: ({ results }) => (results.list as { values: number[] }).values,
          tool: square,
          input: (v) => ({ v }),
          maxParallel: 5,
          ...(maxItems ? { maxItems } : {}),
        },
      },
      { tool: total, input: ({ results }) => ({ parts: results.each }) },
    ],
  });

describe('map steps (PostgreSQL, four workers)', () => {
  let db: TestDatabase;
  let witness: Witness;
  let r: Ratchet;
  const workers: Worker[] = [];
  beforeAll(async () => {
    db = await createTestDatabase('map_run');
    witness = await startWitness(db.url);
    witnessUrl = witness.url;
    r = await createRatchet({ databaseUrl: db.url, workflows: [squares(), squares(3)], logger: silentLogger() });
    for (let i = 0; i < 4; i++) {
      const w = r.worker({ pollIntervalMs: 50, concurrency: 4 });
      await w.start();
      workers.push(w);
    }
  });
  afterAll(async () => {
    await r?.close();
    await witness?.close();
    await db?.drop();
  });
  const ended = async (id: string, polls = 2400): Promise<RunView> => {
    for (let i = 0; i < polls; i++) {
      const run = (await r.getRun(id))!;
      if (['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state)) return run;
      await new Promise((res) => setTimeout(res, 50));
    }
    throw new Error('run did not end');
  };

  it('300 items with maxParallel 5: never more than 5 leased at once, every effect once under its key, results in item order', async () => {
    const { id } = await r.submit('squares', { n: 300 });
    const run = await ended(id);
    expect(run.state, JSON.stringify(run.error)).toBe('succeeded');
    expect(run.result).toEqual({ count: 300, ordered: true });

    const rows = await db.query(
      `SELECT seq, item_index, state, attempt, idempotency_key, concurrency_key, concurrency_limit
       FROM ratchet.stages WHERE run_id = $1 AND group_seq IS NOT NULL ORDER BY item_index`,
      [id],
    );
    expect(rows).toHaveLength(300);
    expect(rows.every((s) => s.state === 'succeeded' && s.concurrency_limit === 5 && s.concurrency_key === `${id}:each`)).toBe(true);
    expect(rows.map((s) => s.idempotency_key)).toEqual(rows.map((_, i) => `${id}:each:${i}`));
    // Never more than 5 at once: the greatest overlap of the items' running intervals (each inside its lease).
    // (The rows' claimed_at is the claim statement's start, before it may wait on the key's lock, so the
    // rows' [claimed_at, finished_at] can only overstate the overlap; the tools' own intervals cannot.)
    expect(running).toHaveLength(300);
    const points = running.flatMap((x) => [
      [x.start, 1],
      [x.end, -1],
    ]) as [number, number][];
    points.sort((a, b) => a[0] - b[0] || a[1] - b[1]); // an end before a start at the same instant
    let live = 0;
    let most = 0;
    for (const [, d] of points) most = Math.max(most, (live += d));
    expect(most).toBeLessThanOrEqual(5);
    expect(most).toBeGreaterThan(1); // they did run in parallel
    expect(rows.every((s) => s.attempt === 1)).toBe(true);

    const applied = await witness.appliedPerKey();
    for (let i = 0; i < 300; i++) expect(applied.get(`${id}:each:${i}`), `item ${i}`).toBe(1);
    expect(witness.staleAccepted()).toEqual([]);
    // The map stage waited without a lease, then gathered on a second claim.
    const types = (await r.events(id)).map((e) => e.type);
    expect(types.filter((t) => t === 'stage_waiting')).toHaveLength(1);
    const map = run.stages.find((s) => s.name === 'each')!;
    expect(map.state).toBe('succeeded');
  }, 180_000);

  it('an empty list gives [], and a list over maxItems fails the step with map_too_large', async () => {
    const empty = await ended((await r.submit('squares', { n: 0 })).id);
    expect(empty.state).toBe('succeeded');
    expect(empty.result).toEqual({ count: 0, ordered: true });

    const big = await ended((await r.submit('squares_bounded', { n: 4 })).id);
    expect(big.state).toBe('failed');
    expect(big.error).toMatchObject({ code: 'map_too_large' });
    expect(big.stages.map((s) => [s.name, s.state])).toEqual([
      ['list', 'succeeded'],
      ['each', 'failed'],
      ['total', 'cancelled'],
    ]);
  });
});
