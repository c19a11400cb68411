import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import type { Tool, ToolContext } from '../../src/definitions/types.js';
import { TransientError } from '../../src/errors.js';

/**
 * Workflows for the task API tests, with switches the tests hold: a gate a tool waits at
 * (released by the test, or by its signal aborting), a count of failures a flaky tool still
 * owes, and a record of every call.
 */
export const calls: { tool: string; key: string; attempt: number; reason?: string; at: number }[] = [];
const gates = new Map<string, () => void>();
const owedFailures = new Map<string, number>();

export const release = (key: string) => gates.get(key)?.();
export const owe = (key: string, failures: number) => owedFailures.set(key, failures);
export const callsOf = (tool: string, key?: string) => calls.filter((c) => c.tool === tool && (key === undefined || c.key === key));

const input = z.object({ key: z.string(), user: z.string().optional() }).strict();
type In = z.infer<typeof input>;

/** Waits until the test releases its gate, or its signal aborts (then throws the reason, as a tool should). */
async function gated(tool: string, i: In, ctx: ToolContext): Promise<{ key: string }> {
  calls.push({ tool, key: i.key, attempt: ctx.attempt, at: Date.now() });
  await new Promise<void>((resolve, reject) => {
    gates.set(i.key, resolve);
    ctx.signal.addEventListener(
      'abort',
      () => {
        calls.push({ tool, key: i.key, attempt: ctx.attempt, reason: (ctx.signal.reason as { code?: string }).code, at: Date.now() });
        reject(ctx.signal.reason);
      },
      { once: true },
    );
  });
  return { key: i.key };
}

const quick = defineToolClass({
  name: 'quick',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '5s',
  maxDuration: '30s',
  retry: { maxAttempts: 2, backoff: { initial: '20ms', factor: 2, max: '100ms', jitter: 0 } },
});
const long = defineToolClass({ name: 'long', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '60s', maxDuration: '120s' });
const orphanClass = defineToolClass({ name: 'orphan', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '5s', maxDuration: '30s' });
const limited = defineToolClass({
  name: 'limited',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '60s',
  maxDuration: '120s',
  concurrency: 1,
});
const rated = defineToolClass({
  name: 'rated',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '5s',
  maxDuration: '30s',
  rateLimit: { max: 1, per: '1h' },
});
const keyedClass = defineToolClass({ name: 'keyed', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '60s', maxDuration: '120s' });
const slowRetry = defineToolClass({
  name: 'slow-retry',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '5s',
  maxDuration: '30s',
  retry: { maxAttempts: 3, backoff: { initial: '1h', factor: 1, max: '1h', jitter: 0 } },
});
const narrow = defineToolClass({ name: 'narrow', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '60s', maxDuration: '120s' });
const ghostClass = defineToolClass({ name: 'ghost', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '5s', maxDuration: '30s' });

const tool = (
  name: string,
  cls: ReturnType<typeof defineToolClass>,
  run: (i: In, ctx: ToolContext) => Promise<unknown>,
): Tool<In, unknown> => defineTool({ name, description: name, class: cls, input, output: z.unknown(), run });

const echo = tool('echo', quick, async (i, ctx) => {
  calls.push({ tool: 'echo', key: i.key, attempt: ctx.attempt, at: Date.now() });
  return { key: i.key };
});
const flaky = tool('flaky', quick, async (i, ctx) => {
  calls.push({ tool: 'flaky', key: i.key, attempt: ctx.attempt, at: Date.now() });
  const owed = owedFailures.get(i.key) ?? 0;
  if (owed > 0) {
    owedFailures.set(i.key, owed - 1);
    throw new TransientError(`upstream 503 (${owed} failure(s) owed)`, { code: 'upstream_503' });
  }
  return { key: i.key };
});
const after = tool('after', quick, async (i, ctx) => {
  calls.push({ tool: 'after', key: i.key, attempt: ctx.attempt, at: Date.now() });
  return { key: i.key, after: true };
});
const gate = tool('gate', long, (i, ctx) => gated('gate', i, ctx));
const orphan = tool('orphan_tool', orphanClass, async () => ({}));
const limitedGate = tool('limited_gate', limited, (i, ctx) => gated('limited_gate', i, ctx));
const ratedTool = tool('rated_tool', rated, async (i, ctx) => {
  calls.push({ tool: 'rated_tool', key: i.key, attempt: ctx.attempt, at: Date.now() });
  return {};
});
const keyedGate = tool('keyed_gate', keyedClass, (i, ctx) => gated('keyed_gate', i, ctx));
const failsOnce = tool('fails_once', slowRetry, async (i, ctx) => {
  calls.push({ tool: 'fails_once', key: i.key, attempt: ctx.attempt, at: Date.now() });
  throw new TransientError('rate limited upstream (429)', { code: 'upstream_429' });
});
const narrowGate = tool('narrow_gate', narrow, (i, ctx) => gated('narrow_gate', i, ctx));
const ghostTool = tool('ghost_tool', ghostClass, async () => ({}));

const wf = (name: string, steps: Tool<In, unknown>[], extra: { concurrencyKey?: { key: (i: In) => string; limit: number } } = {}) =>
  defineWorkflow({ name, input, steps: steps.map((t) => ({ tool: t })), ...extra });

export const apiWorkflows = [
  wf('echo', [echo]),
  wf('flaky', [flaky, after]),
  wf('gate', [gate, after]),
  wf('orphan', [orphan]),
  wf('limited', [limitedGate]),
  wf('rated', [ratedTool]),
  wf('keyed', [keyedGate], { concurrencyKey: { key: (i) => i.user ?? 'nobody', limit: 1 } }),
  wf('delayed', [failsOnce]),
  wf('narrow', [narrowGate]),
  wf('ghost', [ghostTool]),
];
