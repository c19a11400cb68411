/**
 * The engine benchmark's workflow: 10 steps of one no-op tool. The class's lease is long
 * (30 s, heartbeat 10 s) so no lease is ever extended or lost during a benchmark: what is
 * measured is claim, finish and wake-up, not heartbeats.
 */
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';

export const NOOP_CLASS = 'noop';
export const NOOP_STEPS = 10;

export const noopClass = defineToolClass({
  name: NOOP_CLASS,
  lease: '30s',
  heartbeat: '10s',
  timeout: '30s',
  maxDuration: '1m',
  retry: { maxAttempts: 3 },
});

export const noopTool = defineTool({
  name: 'noop',
  description: 'does nothing and returns an empty object',
  class: noopClass,
  input: z.object({}),
  output: z.object({}),
  run: async () => ({}),
});

export const noop10 = defineWorkflow({
  name: 'noop10',
  input: z.object({}),
  steps: Array.from({ length: NOOP_STEPS }, (_, i) => ({ tool: noopTool, name: `s${i + 1}` })),
});

export default noop10;

/**
 * For the reclaim measurement (bench/engine.ts --scale): one stage that runs until aborted, of a
 * class with a short lease, so a worker killed mid-stage leaves leases that expire at most 3 s later.
 */
export const SLEEPY_CLASS = 'sleepy';
export const SLEEPY_LEASE_MS = 3000;
export const sleepyClass = defineToolClass({
  name: SLEEPY_CLASS,
  lease: '3s',
  heartbeat: '500ms',
  timeout: '10m',
  maxDuration: '20m',
  retry: { maxAttempts: 5 },
});
export const sleepyTool = defineTool({
  name: 'sleepy',
  description: 'waits until aborted',
  class: sleepyClass,
  input: z.object({}),
  output: z.object({}),
  run: (_input, ctx) =>
    new Promise((resolve) => {
      const t = setTimeout(() => resolve({}), 600_000);
      ctx.signal.addEventListener('abort', () => {
        clearTimeout(t);
        resolve({});
      });
    }),
});
export const sleepy = defineWorkflow({ name: 'sleepy', input: z.object({}), steps: [{ tool: sleepyTool, name: 'sleep' }] });
