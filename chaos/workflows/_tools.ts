/**
 * The chaos soak's tools. Every tool sends one irreversible request to the fenced receiver
 * (RECEIVER_URL, through this worker's own link proxy) with Idempotency-Key and
 * X-Execution-Fence, after ctx.beginEffect, and returns the key it used, so the checker can
 * match each succeeded stage to exactly one applied effect. Files starting with `_` are not
 * loaded as workflow files; v1/ and v2/ import from here.
 */
import { z } from 'zod';
import { defineTool, defineToolClass } from '../../src/definitions/index.js';
import type { ToolContext } from '../../src/definitions/types.js';
import { PermanentError, TransientError } from '../../src/errors.js';

const receiver = () => process.env.RECEIVER_URL ?? 'http://127.0.0.1:9';
const worker = () => process.env.CHAOS_WORKER ?? 'unknown';

/** Short leases, so faults past a lease cost seconds; many attempts, so a fault storm rarely exhausts a stage. */
const timing = {
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '6s',
  maxDuration: '30s',
  retry: { maxAttempts: 12, backoff: { initial: '200ms', factor: 2, max: '2s' } },
} as const;

export const chaosIo = defineToolClass({ name: 'chaos_io', ...timing });
/** A class with a global concurrency limit (checked by the soak from the lease intervals). */
export const CHAOS_LIMITED_CONCURRENCY = 2;
export const chaosLimited = defineToolClass({ name: 'chaos_limited', ...timing, concurrency: CHAOS_LIMITED_CONCURRENCY });
export const chaosAgentTools = defineToolClass({ name: 'chaos_agent_tools', ...timing });
export const chaosModel = defineToolClass({ name: 'chaos_model', ...timing });
export const chaosRoll = defineToolClass({ name: 'chaos_roll', ...timing });
/** A map's items (their own class: a map with maxParallel puts its class on the keyed claim). */
export const chaosMap = defineToolClass({ name: 'chaos_map', ...timing });

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const t = setTimeout(resolve, ms);
    signal.addEventListener(
      'abort',
      () => {
        clearTimeout(t);
        reject(signal.reason);
      },
      { once: true },
    );
  });

/** One fenced request; 2xx is done (applied or replayed), 409/5xx retried, anything else permanent. */
export async function sendEffect(ctx: ToolContext, payload: Record<string, unknown>): Promise<{ key: string; fence: string }> {
  ctx.beginEffect(`effect:${ctx.idempotencyKey}`);
  const res = await fetch(`${receiver()}/effect`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'idempotency-key': ctx.idempotencyKey,
      'x-execution-fence': ctx.fence,
      'x-chaos-worker': worker(),
      ...(ctx.traceparent ? { traceparent: ctx.traceparent } : {}), // the tool call's span: the receiver joins the run's trace
    },
    body: JSON.stringify(payload),
    signal: ctx.signal,
  });
  const body = (await res.json().catch(() => null)) as { error?: string } | null;
  if (res.status === 200 || res.status === 201) return { key: ctx.idempotencyKey, fence: ctx.fence };
  if (res.status === 409 || res.status >= 500) throw new TransientError(`receiver answered ${res.status} ${body?.error ?? ''}`);
  throw new PermanentError(`receiver answered ${res.status} ${body?.error ?? ''}`);
}

const work = z.object({ n: z.number().int(), work: z.number().int().min(0).max(5000) }).passthrough();
const out = z.object({ key: z.string(), fence: z.string() });

export const chaosEffect = defineTool({
  name: 'chaos_effect',
  description: 'works a while, then one fenced effect',
  class: chaosIo,
  input: work,
  output: out,
  run: async (i, ctx) => {
    await sleep(i.work, ctx.signal);
    return sendEffect(ctx, { n: i.n });
  },
});

export const chaosLimitedEffect = defineTool({
  name: 'chaos_limited_effect',
  description: 'one fenced effect under a class concurrency limit',
  class: chaosLimited,
  input: work,
  output: out,
  run: async (i, ctx) => {
    await sleep(i.work, ctx.signal);
    return sendEffect(ctx, { n: i.n });
  },
});

/** A map item: works a while, then one fenced effect (its key: run, step and index). */
export const chaosMapItem = defineTool({
  name: 'chaos_map_item',
  description: 'one fenced effect per map item',
  class: chaosMap,
  input: work,
  output: out,
  run: async (i, ctx) => {
    await sleep(i.work, ctx.signal);
    return sendEffect(ctx, { n: i.n, item: (i as { item?: number }).item ?? null });
  },
});

/** How long a gated call waits for a person before it is refused (approval_timeout): the driver decides before, mostly. */
export const APPROVAL_TIMEOUT_MS = 8000;

/** A fenced effect behind an approval gate (issue 10): it acts only once a person approved the call. */
export const chaosGatedEffect = defineTool({
  name: 'chaos_gated_effect',
  description: 'one fenced effect, only once approved',
  class: chaosIo,
  input: work,
  output: out,
  approval: true,
  approvalTimeout: `${APPROVAL_TIMEOUT_MS}ms`,
  run: async (i, ctx) => {
    await sleep(i.work, ctx.signal);
    return sendEffect(ctx, { n: i.n, gated: true });
  },
});

/** Fails permanently the first time the receiver sees its key (the run fails; the driver retries it), then one effect. */
export const chaosFlaky = defineTool({
  name: 'chaos_flaky',
  description: 'fails once permanently, then one fenced effect',
  class: chaosIo,
  input: work,
  output: out,
  run: async (i, ctx) => {
    const res = await fetch(`${receiver()}/flaky`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(ctx.traceparent ? { traceparent: ctx.traceparent } : {}) },
      body: JSON.stringify({ key: ctx.idempotencyKey }),
      signal: ctx.signal,
    });
    if (res.status !== 200) throw new TransientError(`receiver answered ${res.status} to /flaky`);
    if (((await res.json()) as { fail: boolean }).fail) throw new PermanentError('flaky: the first call of this key fails on purpose');
    await sleep(i.work, ctx.signal);
    return sendEffect(ctx, { n: i.n, flaky: true });
  },
});

const tenantInput = z.object({ tenant: z.string(), n: z.number().int(), work: z.number().int().min(0).max(5000) });
export const tenantEffect = defineTool({
  name: 'tenant_effect',
  description: 'one fenced effect for a tenant',
  class: chaosIo,
  input: tenantInput,
  output: out,
  run: async (i, ctx) => {
    await sleep(i.work, ctx.signal);
    return sendEffect(ctx, { tenant: i.tenant, n: i.n });
  },
});

/** The agent's tool: its key derives from what it means, so a re-proposed call is one effect. */
export const agentEffect = defineTool({
  name: 'agent_effect',
  description: 'files a case for a reference (irreversible, fenced)',
  class: chaosAgentTools,
  input: z.object({ ref: z.string().min(1).max(200) }),
  output: out,
  idempotencyKey: (i) => `case:${i.ref}`,
  run: async (i, ctx) => sendEffect(ctx, { ref: i.ref }),
});

/** Every tool whose succeeded stage applied exactly one effect (the checker's list). */
export const EFFECT_TOOLS = [
  'chaos_effect',
  'chaos_limited_effect',
  'chaos_map_item',
  'chaos_gated_effect',
  'chaos_flaky',
  'tenant_effect',
  'agent_effect',
  'roll_prepare',
  'roll_check',
  'roll_finish',
];

/** A step of the `roll` workflow as version `version` has it. */
export function rollStep(name: string, version: 1 | 2) {
  return defineTool({
    name,
    description: `${name} (version ${version})`,
    class: chaosRoll,
    input: z.object({ n: z.number().int() }).passthrough(),
    output: z.object({ n: z.number(), version: z.literal(version), key: z.string(), fence: z.string() }),
    run: async (i, ctx) => ({ n: i.n, version, ...(await sendEffect(ctx, { n: i.n, step: name })) }),
  });
}
