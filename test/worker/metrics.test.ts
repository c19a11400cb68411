import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { createMetrics } from '../../src/observability/metrics.js';
import { Worker } from '../../src/worker/worker.js';

const timing = { lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '2s', maxDuration: '10s' } as const;
const served = defineToolClass({ name: 'served', ...timing });
const orphan = defineToolClass({ name: 'orphan', ...timing });
const a = defineTool({
  name: 'a',
  description: 'a',
  class: served,
  input: z.object({}).passthrough(),
  output: z.object({}).passthrough(),
  run: async () => ({}),
});
const b = defineTool({
  name: 'b',
  description: 'b',
  class: orphan,
  input: z.object({}).passthrough(),
  output: z.object({}).passthrough(),
  run: async () => ({}),
});

/** Prometheus metrics, and a class no worker serves reported as such. */
describe('metrics', () => {
  let r: Ratchet;
  const metrics = createMetrics();
  beforeAll(async () => {
    r = await createRatchet({
      dataDir: ':memory:',
      logger: silentLogger(),
      workflows: [defineWorkflow({ name: 'two', input: z.object({}).passthrough(), steps: [{ tool: a }, { tool: b }] })],
    });
  });
  afterAll(async () => {
    await r.close();
  });

  it('counts claims and durations per class, and reports a class that no worker serves', async () => {
    const w = new Worker(
      { store: r.store, registry: r.registry, transport: r.transport, logger: r.logger, metrics },
      { classes: ['served'], pollIntervalMs: 50, sweepIntervalMs: 100 },
    );
    await w.start();
    try {
      const { id } = await r.submit('two', {});
      for (let i = 0; i < 100 && (await r.getRun(id))!.stages[1]!.state !== 'queued'; i++) await new Promise((res) => setTimeout(res, 25));
      // A sweep or two (every 100 ms) sets the gauge: waited for, not slept.
      let unserved = await metrics.unservedClass.get();
      const value = (cls: string) => unserved.values.find((v) => v.labels.tool_class === cls)?.value;
      for (let i = 0; i < 400 && value('orphan') !== 1; i++) {
        await new Promise((res) => setTimeout(res, 25));
        unserved = await metrics.unservedClass.get();
      }
      expect(value('orphan')).toBe(1);
      expect(value('served')).toBe(0);
      const claimed = await metrics.stagesClaimed.get();
      expect(claimed.values.find((v) => v.labels.tool_class === 'served')?.value).toBe(1);
      const text = await metrics.registry.metrics();
      expect(text).toContain('ratchet_stage_duration_seconds_count{tool_class="served",workflow="two",outcome="finished"} 1');
      expect(text).toMatch(/ratchet_results_rejected_total/);
      expect(text).not.toContain(id); // labels are bounded: never run ids
    } finally {
      await w.stop({ graceMs: 0 });
    }
  });

  it('fails stages of an unserved class only when asked to (failUnservedAfterMs), never by default', async () => {
    const w = new Worker(
      { store: r.store, registry: r.registry, transport: r.transport, logger: r.logger, metrics },
      { classes: ['served'], pollIntervalMs: 50, sweepIntervalMs: 100 },
    );
    await w.start();
    const { id } = await r.submit('two', {});
    try {
      await new Promise((res) => setTimeout(res, 1500));
      expect((await r.getRun(id))!.stages[1]!.state).toBe('queued'); // waits for a worker, however long
    } finally {
      await w.stop({ graceMs: 0 });
    }
    const strict = new Worker(
      { store: r.store, registry: r.registry, transport: r.transport, logger: r.logger, metrics },
      { classes: ['served'], pollIntervalMs: 50, sweepIntervalMs: 100, failUnservedAfterMs: 1000 },
    );
    await strict.start();
    try {
      let run = (await r.getRun(id))!;
      for (let i = 0; i < 100 && run.state !== 'failed'; i++) {
        await new Promise((res) => setTimeout(res, 50));
        run = (await r.getRun(id))!;
      }
      expect(run.state).toBe('failed');
      expect(run.error).toMatchObject({ code: 'no_worker', toolClass: 'orphan' });
    } finally {
      await strict.stop({ graceMs: 0 });
    }
  });
});
