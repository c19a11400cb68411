/**
 * The soak's workflows that every deploy carries: a static pipeline, a class-limited job, a
 * job that fails once (retried through the API), a tenant job under a concurrency key, and an
 * agent on the scripted model. Fan-out (`after`), `map` and waits do not exist in the engine
 * yet: add them here and to the driver's mix (chaos/driver.ts, WORKFLOW_MIX) when they land.
 */
import { z } from 'zod';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineWorkflow } from '../../src/definitions/index.js';
import { agentEffect, chaosEffect, chaosFlaky, chaosLimitedEffect, chaosModel, tenantEffect } from './_tools.js';

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
