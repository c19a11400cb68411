import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet } from '../../src/engine.js';
import { InvalidDefinitionError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { defineSchedule } from '../../src/schedules/define.js';
import { until } from '../api/helpers.js';

const cls = defineToolClass({ name: 'sched-embedded', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '2s', maxDuration: '10s' });
const echo = defineTool({
  name: 'sched_emb_echo',
  description: 'echo',
  class: cls,
  input: z.object({ n: z.number() }),
  output: z.object({ n: z.number() }),
  run: async (i) => i,
});
const wf = defineWorkflow({ name: 'sched-embedded', input: z.object({ n: z.number() }), steps: [{ tool: echo }] });

/** createRatchet({ schedules }) on the embedded store: a worker's sweeper fires the tick and runs it (PGlite: one connection, no pass holds a transaction). */
describe('schedules on the embedded store', () => {
  it('a tick fires through the sweeper and its run succeeds', async () => {
    const hourly = defineSchedule({ name: 'emb-hourly', cron: '0 * * * *', workflow: wf, input: { n: 7 } });
    const r = await createRatchet({ dataDir: ':memory:', workflows: [wf], schedules: [hourly], logger: silentLogger() });
    try {
      expect((await r.schedules.list()).map((s) => [s.name, s.source])).toEqual([['emb-hourly', 'code']]);
      await r.worker({ sweepIntervalMs: 50, pollIntervalMs: 20 }).start();
      await r.store.clock.advance(3600_000);
      const page = await until('the scheduled run', async () => (await r.listRuns({ workflow: 'sched-embedded' })).runs[0]);
      await until('it succeeded', async () => (await r.getRun(page.id))?.state === 'succeeded');
      expect((await r.schedules.get('emb-hourly'))!.lastRunId).toBe(page.id);
    } finally {
      await r.close();
    }
  });

  it('refuses a schedule whose workflow is not loaded, before anything opens', async () => {
    const orphan = defineSchedule({ name: 'orphan', cron: '0 * * * *', workflow: 'not-loaded' });
    await expect(
      createRatchet({ dataDir: ':memory:', workflows: [wf], schedules: [orphan], logger: silentLogger() }),
    ).rejects.toBeInstanceOf(InvalidDefinitionError);
  });
});
