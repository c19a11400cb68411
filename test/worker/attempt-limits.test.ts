import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow, type ToolStepOptions } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import { settledRun } from '../helpers/settled-run.js';
import { TransientError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { abortCode } from '../helpers/abort.js';

/**
 * Retry arithmetic (issue 9, item 9) on real PostgreSQL: `timeout` limits each call (reconcile
 * and run each get their own), `maxDuration` the attempt's whole life from its claim, enforced
 * by the extend statement — so it fires when the calls together pass it.
 * Every tool here sends an effect on attempt 1 and fails, so attempt 2 reconciles first.
 */
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const empty = z.object({}).passthrough();
const seen: Record<string, string[]> = {};
const note = (tool: string, what: string) => (seen[tool] ??= []).push(what);

/** timeout 4 s < maxDuration 5 s: a 3 s reconcile then a run that does not end passes 5 s first. */
const bounded = defineToolClass({
  name: 'bounded',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '4s',
  maxDuration: '5s',
  retry: { maxAttempts: 2, backoff: { initial: '50ms', jitter: 0 } },
});
const overrun = defineTool({
  name: 'overrun',
  description: 'reconcile 3 s, then a run that waits for its signal',
  class: bounded,
  input: empty,
  output: empty,
  run: async (_i, ctx) => {
    if (ctx.attempt === 1) {
      ctx.beginEffect('create');
      throw new TransientError('connection reset after the request was sent', { code: 'connection_reset' });
    }
    const reason = await abortCode(ctx.signal);
    note('overrun', reason);
    throw ctx.signal.reason;
  },
  reconcile: async () => {
    await sleep(3000);
    return { done: false };
  },
});

/** timeout 1.5 s each for reconcile and run. */
const brisk = defineToolClass({
  name: 'brisk',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '1500ms',
  maxDuration: '30s',
  retry: { maxAttempts: 3, backoff: { initial: '50ms', jitter: 0 } },
});
const effectThenFail = (ctx: { attempt: number; beginEffect(id: string): void }) => {
  ctx.beginEffect('create');
  throw new TransientError('connection reset after the request was sent', { code: 'connection_reset' });
};
const slowBoth = defineTool({
  name: 'slow_both',
  description: 'reconcile 1 s, run 1 s: each within 1.5 s, together past it',
  class: brisk,
  input: empty,
  output: z.object({ attempt: z.number() }),
  run: async (_i, ctx) => {
    if (ctx.attempt === 1) effectThenFail(ctx);
    await sleep(1000);
    return { attempt: ctx.attempt };
  },
  reconcile: async () => {
    await sleep(1000);
    return { done: false };
  },
});
const hangingReconcile = defineTool({
  name: 'hanging_reconcile',
  description: 'reconcile ignores its signal on attempt 2, answers on attempt 3',
  class: brisk,
  input: empty,
  output: z.object({ via: z.string(), attempt: z.number() }),
  run: async (_i, ctx) => {
    effectThenFail(ctx);
    return { via: 'run', attempt: ctx.attempt };
  },
  reconcile: async (_i, ctx) => {
    if (ctx.attempt === 2) await new Promise(() => {}); // never settles, deaf to its signal
    return { done: true, output: { via: 'reconcile', attempt: ctx.attempt } };
  },
});

/**
 * timeout 3 s < maxDuration 3.5 s, backoff 1 s then 2 s (no jitter). Attempt 1 sends an effect and fails (retried
 * by its finish after 1 s); attempt 2 reconciles for 2.5 s, then its run waits for its signal, so the extend ends it
 * past maxDuration (~3.5-4 s after its claim, before the run's own timeout at ~5.5 s); attempt 3 answers.
 * `patient` allows a third attempt; `hurried`'s maxElapsed (4 s from the first claim) is spent by the overrun.
 */
const overrunClass = (name: string, maxElapsed?: string) =>
  defineToolClass({
    name,
    lease: '3s',
    heartbeat: '500ms',
    jitter: '200ms',
    timeout: '3s',
    maxDuration: '3500ms',
    retry: { maxAttempts: 3, backoff: { initial: '1s', factor: 2, jitter: 0 }, ...(maxElapsed ? { maxElapsed } : {}) },
  });
const overrunsOnce = (name: string, cls: ReturnType<typeof defineToolClass>) =>
  defineTool({
    name,
    description: 'attempt 1 fails after its effect; attempt 2 reconciles, then waits for its signal; attempt 3 answers',
    class: cls,
    input: empty,
    output: z.object({ attempt: z.number() }),
    run: async (_i, ctx) => {
      if (ctx.attempt === 1) effectThenFail(ctx);
      if (ctx.attempt === 2) {
        await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve, { once: true }));
        throw ctx.signal.reason;
      }
      return { attempt: ctx.attempt };
    },
    reconcile: async (_i, ctx) => {
      if (ctx.attempt === 2) await sleep(2500);
      return { done: false };
    },
  });
const patient = overrunsOnce('patient_overrun', overrunClass('patient'));
const hurried = overrunsOnce('hurried_overrun', overrunClass('hurried', '4s'));

const wf = (name: string, tool: ToolStepOptions['tool']) => defineWorkflow({ name, input: empty, steps: [{ tool }] });

describe('timeout per call, maxDuration per attempt', () => {
  let db: TestDatabase;
  let r: Ratchet;
  beforeAll(async () => {
    db = await createTestDatabase('attempt_limits');
    r = await createRatchet({
      databaseUrl: db.url,
      workflows: [
        wf('overrun', overrun),
        wf('slow-both', slowBoth),
        wf('hanging-reconcile', hangingReconcile),
        wf('patient-overrun', patient),
        wf('hurried-overrun', hurried),
      ],
      logger: silentLogger(),
    });
    await r.worker({ pollIntervalMs: 50 }).start();
  });
  afterAll(async () => {
    await r.close();
    await db.drop();
  });

  const settled = (id: string, timeoutMs = 30_000): Promise<RunView> => settledRun(r, id, timeoutMs);

  it('maxDuration fires: a reconcile and a run, each within the timeout, together pass maxDuration and the extend ends the attempt', async () => {
    const { id } = await r.submit('overrun', {});
    const run = await settled(id);
    expect(run.state).toBe('failed');
    expect(run.stages[0]!.attempt).toBe(2);
    expect(run.stages[0]!.lastError).toMatchObject({ code: 'stage_duration_exceeded', maxDurationMs: 5000 });
    expect(run.error).toMatchObject({ code: 'stage_duration_exceeded' });
    expect(seen.overrun).toEqual(['stage_duration_exceeded']); // the tool's signal said why
    const events = await r.events(id);
    expect(events.filter((e) => e.type === 'stage_duration_exceeded').map((e) => e.attempt)).toEqual([2]);
    expect(events.find((e) => e.type === 'reconciled')).toMatchObject({ attempt: 2, data: { done: false } });
  });

  it('an attempt past maxDuration is retried after its policy’s backoff, the chosen delay in its event', async () => {
    const { id } = await r.submit('patient-overrun', {});
    const run = await settled(id);
    expect(run.state).toBe('succeeded');
    expect(run.stages[0]!.attempt).toBe(3);
    const events = await r.events(id);
    const over = events.find((e) => e.type === 'stage_duration_exceeded');
    expect(over).toMatchObject({ attempt: 2, data: { nextState: 'queued', delayMs: 2000 } }); // the policy's second delay
    const overAt = over!.at.getTime();
    expect(new Date((over!.data as { availableAt: string }).availableAt).getTime()).toBe(overAt + 2000);
    const third = events.find((e) => e.type === 'job_claimed' && e.attempt === 3);
    expect(third!.at.getTime()).toBeGreaterThanOrEqual(overAt + 2000); // not at once
  });

  it('an attempt past maxDuration whose policy’s maxElapsed is spent is not retried: the run fails (decision max_elapsed)', async () => {
    const { id } = await r.submit('hurried-overrun', {});
    const run = await settled(id);
    expect(run.state).toBe('failed');
    expect(run.stages[0]!.attempt).toBe(2); // a third attempt was allowed by maxAttempts, not by maxElapsed
    expect(run.error).toMatchObject({ code: 'stage_duration_exceeded', decision: 'max_elapsed' });
    const over = (await r.events(id)).find((e) => e.type === 'stage_duration_exceeded');
    expect(over).toMatchObject({ attempt: 2, data: { nextState: 'failed', decision: 'max_elapsed' } });
  });

  it('reconcile has its own time limit: a slow reconcile does not eat the run’s timeout', async () => {
    const { id } = await r.submit('slow-both', {});
    const run = await settled(id);
    expect(run.state).toBe('succeeded');
    expect(run.result).toEqual({ attempt: 2 });
  });

  it('a reconcile that does not answer times out on its own limit, and the attempt is retried', async () => {
    const { id } = await r.submit('hanging-reconcile', {});
    const run = await settled(id);
    expect(run.state).toBe('succeeded');
    expect(run.result).toEqual({ via: 'reconcile', attempt: 3 });
    const retries = (await r.events(id)).filter((e) => e.type === 'retry_scheduled');
    expect(retries.map((e) => e.attempt)).toEqual([1, 2]);
    const error = (retries[1]!.data as { error: { code: string; message: string } }).error;
    expect(error.code).toBe('timeout');
    expect(error.message).toMatch(/reconcile of hanging_reconcile passed its time limit of 1500 ms/);
  });
});
