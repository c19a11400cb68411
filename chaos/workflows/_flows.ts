/**
 * The soak's workflows that every deploy carries: a static pipeline, a class-limited job, a
 * job that fails once (retried through the API), a tenant job under a concurrency key, an
 * agent on the scripted model, and the run graph (issue 11): a fan-out of three with a join, a
 * map with maxParallel, and a run with a child run. Every tool is a fenced effect at the
 * receiver; and waits (issue 10): a fenced effect behind an approval gate, and a step that waits
 * for a signal before a fenced effect (the driver decides and signals at seeded moments).
 */
import { z } from 'zod';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineWorkflow } from '../../src/definitions/index.js';
import {
  agentEffect,
  chaosEffect,
  chaosFlaky,
  chaosGatedEffect,
  chaosLimitedEffect,
  chaosMapItem,
  chaosModel,
  tenantEffect,
} from './_tools.js';

const input = z.object({ n: z.number().int(), work: z.number().int().min(0).max(5000) });

export const pipeline = defineWorkflow({
  name: 'chaos_pipeline',
  input,
  steps: [1, 2, 3].map((i) => ({
    tool: chaosEffect,
    name: `p${i}`,
    input: ({ input: x }: { input: unknown }) => x as z.infer<typeof input>,
  })),
});

export const limited = defineWorkflow({ name: 'chaos_limited', input, steps: [{ tool: chaosLimitedEffect, input: ({ input: x }) => x }] });

export const flaky = defineWorkflow({
  name: 'chaos_flaky',
  input,
  steps: [
    { tool: chaosEffect, name: 'before', input: ({ input: x }) => x },
    { tool: chaosFlaky, name: 'flaky', input: ({ input: x }) => x },
  ],
});

/** Per-tenant concurrency: no more than TENANT_LIMIT stages of one tenant run at once. */
export const TENANT_LIMIT = 2;
const tenantInput = z.object({ tenant: z.string().min(1), n: z.number().int(), work: z.number().int().min(0).max(5000) });
export const tenant = defineWorkflow({
  name: 'chaos_tenant',
  input: tenantInput,
  concurrencyKey: { key: (i) => i.tenant, limit: TENANT_LIMIT },
  steps: [
    { tool: tenantEffect, name: 't1', input: ({ input: x }) => x },
    { tool: tenantEffect, name: 't2', input: ({ input: x }) => x },
  ],
});

export const agent = defineAgent({
  name: 'chaos_agent',
  input: z.object({ ref: z.string().min(1) }),
  model: { name: 'scripted', class: chaosModel },
  instructions: 'File the two cases of the reference, then answer.',
  tools: [agentEffect],
});

type Work = z.infer<typeof input>;
const pass = ({ input: x }: { input: unknown }) => x as Work;

/** Fan-out and join: three branches start with the run; the join waits for all three. */
export const FANOUT_BRANCHES = ['f1', 'f2', 'f3'];
export const fanout = defineWorkflow({
  name: 'chaos_fanout',
  input,
  steps: [
    ...FANOUT_BRANCHES.map((name) => ({ tool: chaosEffect, name, after: [], input: pass })),
    {
      tool: chaosEffect,
      name: 'join',
      after: FANOUT_BRANCHES,
      input: ({ input: x, results }) => ({ ...x, joined: Object.keys(results).length }),
    },
  ],
});

/** A map over 2-4 items, at most MAP_MAX_PARALLEL leased at once per run, then a step after it. */
export const MAP_MAX_PARALLEL = 2;
export const MAP_ITEMS_MAX = 4;
const mapInput = input.extend({ items: z.number().int().min(1).max(MAP_ITEMS_MAX) });
export const map = defineWorkflow({
  name: 'chaos_map',
  input: mapInput,
  steps: [
    {
      name: 'each',
      map: {
        items: ({ input: x }) => Array.from({ length: x.items }, (_, i) => i),
        tool: chaosMapItem,
        input: (item, _i, { input: x }) => ({ n: x.n, work: x.work, item: item as number }),
        maxParallel: MAP_MAX_PARALLEL,
      },
    },
    {
      tool: chaosEffect,
      name: 'after_map',
      input: ({ input: x, results }) => ({ n: x.n, work: 0, gathered: (results.each as unknown[]).length }),
    },
  ],
});

/** The child run: two fenced steps of its own. */
export const child = defineWorkflow({
  name: 'chaos_child',
  input,
  steps: [
    { tool: chaosEffect, name: 'c1', input: pass },
    { tool: chaosEffect, name: 'c2', input: pass },
  ],
});

/** A step, a child run (started keyed by its stage, waited for without a lease), a step. */
export const parent = defineWorkflow({
  name: 'chaos_parent',
  input,
  steps: [
    { tool: chaosEffect, name: 'p1', input: pass },
    { name: 'child', workflow: child, input: pass },
    { tool: chaosEffect, name: 'p2', input: pass },
  ],
});

/** An approval-gated fenced effect: the driver approves or rejects at a seeded moment (or lets it time out). */
export const approval = defineWorkflow({
  name: 'chaos_approval',
  input,
  steps: [{ tool: chaosGatedEffect, name: 'gated', input: pass }],
});

/** How long the signal step waits before it goes on without it (onTimeout). */
export const SIGNAL_TIMEOUT_MS = 10_000;
export const SIGNAL_NAME = 'go';
/** Waits for the `go` signal (or its timeout), then one fenced effect. */
export const signal = defineWorkflow({
  name: 'chaos_signal',
  input,
  steps: [
    {
      waitForSignal: {
        name: SIGNAL_NAME,
        schema: z.object({ n: z.number().int() }),
        timeout: `${SIGNAL_TIMEOUT_MS}ms`,
        onTimeout: ({ input: x }) => ({ n: (x as Work).n, timedOut: true }),
      },
    },
    { tool: chaosEffect, name: 'after_signal', input: pass },
  ],
});
