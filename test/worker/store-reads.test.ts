import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import { TransientError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import type { Worker } from '../../src/worker/worker.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * Issue 9, item 2 (review findings 1 and 2): a store error of a kind that is not asked again
 * (here XX000, as after a failover or an internal error) on a read between the claim and the
 * finish — the next step's earlier results, the effect record before reconcile — is an
 * unknown outcome: the attempt ends without a finish (`unknown`), never as the tool's failure
 * (no retry_scheduled carrying the store's error). The lease then runs out and is reclaimed.
 */
const quick = defineToolClass({
  name: 'reads_quick',
  lease: '1s',
  heartbeat: '300ms',
  jitter: '50ms',
  timeout: '10s',
  maxDuration: '30s',
  retry: { maxAttempts: 3, backoff: { initial: '50ms', jitter: 0 } },
});
const empty = z.object({}).passthrough();
const calls: Record<string, number[]> = {};
const first = defineTool({
  name: 'reads_first',
  description: 'first',
  class: quick,
  input: empty,
  output: z.object({ n: z.number() }),
  run: async (_i, ctx) => {
    (calls.first ??= []).push(ctx.attempt);
    return { n: 1 };
  },
});
const second = defineTool({
  name: 'reads_second',
  description: 'second',
  class: quick,
  input: empty,
  output: empty,
  run: async () => ({}),
});
const third = defineTool({ name: 'reads_third', description: 'third', class: quick, input: empty, output: empty, run: async () => ({}) });
const reconciled = defineTool({
  name: 'reads_reconciled',
  description: 'sends an effect and fails on attempt 1',
  class: quick,
  input: empty,
  output: empty,
  run: async (_i, ctx) => {
    (calls.reconciled ??= []).push(ctx.attempt);
    if (ctx.attempt === 1) {
      ctx.beginEffect('create');
      throw new TransientError('reset after sending');
    }
    return {};
  },
  reconcile: async () => ({ done: false }),
});
const workflows = [
  // Step 3's input reads step 1's result from the store (the finish of step 2 knows only its own output).
  defineWorkflow({
    name: 'reads_results',
    input: empty,
    steps: [
      { tool: first },
      { tool: second },
      { tool: third, input: ({ results }) => ({ n: (results as { reads_first: { n: number } }).reads_first.n }) },
    ],
  }),
  defineWorkflow({ name: 'reads_effect', input: empty, steps: [{ tool: reconciled }] }),
];

const internal = () => Object.assign(new Error('injected: internal error'), { code: 'XX000' });

describe('store reads between the claim and the finish (PostgreSQL)', () => {
  let db: TestDatabase;
  let r: Ratchet;
  let w: Worker;
  beforeAll(async () => {
    db = await createTestDatabase('store_reads');
    r = await createRatchet({ databaseUrl: db.url, workflows, logger: silentLogger() });
    w = r.worker({ pollIntervalMs: 50 });
    await w.start();
  });
  afterAll(async () => {
    await r?.close();
    await db?.drop();
  });
  const ended = async (id: string): Promise<RunView> => {
    for (let i = 0; i < 800; i++) {
      const run = (await r.getRun(id))!;
      if (['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state)) return run;
      await new Promise((res) => setTimeout(res, 25));
    }
    throw new Error('run did not end');
  };

  it('an XX000 on the earlier-results read (the run graph) ends the attempt as unknown, not as the tool failing', async () => {
    const real = r.store.graphStages.bind(r.store);
    let thrown = 0;
    r.store.graphStages = async (runId) => {
      if (thrown++ === 0) throw internal();
      return real(runId);
    };
    try {
      const unknownBefore = w.ended.unknown;
      const { id } = await r.submit('reads_results', {});
      const run = await ended(id);
      expect(run.state).toBe('succeeded');
      expect(w.ended.unknown).toBe(unknownBefore + 1);
      const ev = await r.events(id);
      expect(ev.map((e) => e.type)).not.toContain('retry_scheduled');
      expect(ev.map((e) => e.type)).toContain('lease_reclaimed');
      expect(JSON.stringify(run.stages)).not.toContain('injected');
    } finally {
      r.store.graphStages = real;
    }
  });

  it('an XX000 on the effect record before reconcile ends the attempt as unknown, not spent as a tool failure', async () => {
    const real = r.store.effectStarted.bind(r.store);
    let thrown = 0;
    r.store.effectStarted = async (...a) => {
      if (thrown++ === 0) throw internal();
      return real(...a);
    };
    try {
      const unknownBefore = w.ended.unknown;
      const { id } = await r.submit('reads_effect', {});
      const run = await ended(id);
      expect(run.state).toBe('succeeded');
      expect(thrown).toBeGreaterThan(0);
      expect(w.ended.unknown).toBe(unknownBefore + 1);
      const ev = await r.events(id);
      expect(ev.filter((e) => e.type === 'retry_scheduled')).toHaveLength(1); // attempt 1's own failure only
      expect(JSON.stringify(ev)).not.toContain('injected');
    } finally {
      r.store.effectStarted = real;
    }
  });
});
