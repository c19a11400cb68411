import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow, type ToolStepOptions } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import { InvalidInputError, PermanentError, TransientError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { abortCode } from '../helpers/abort.js';

/** Retry, timeout, permanent failure, exhaustion, cancel and graceful stop, in one process on PGlite. */
const quick = defineToolClass({
  name: 'quick',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '400ms',
  maxDuration: '30s',
  retry: { maxAttempts: 3, backoff: { initial: '50ms', factor: 2, max: '200ms', jitter: 0 } },
});
const calls: Record<string, { attempt: number; reason?: string }[]> = {};
const note = (tool: string, attempt: number, reason?: string) => (calls[tool] ??= []).push({ attempt, reason });

const slowThenFast = defineTool({
  name: 'slow_then_fast',
  description: 'hangs past its timeout on attempt 1',
  class: quick,
  input: z.object({}).passthrough(),
  output: z.object({ attempt: z.number() }),
  run: async (_i, ctx) => {
    note('slow_then_fast', ctx.attempt);
    if (ctx.attempt === 1) {
      await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve(), { once: true }));
      note('slow_then_fast', ctx.attempt, (ctx.signal.reason as { code: string }).code);
      await new Promise((r) => setTimeout(r, 10_000)); // ignores the abort: the timeout must still end the attempt
    }
    return { attempt: ctx.attempt };
  },
});
const permanent = defineTool({
  name: 'permanent',
  description: 'bad input, never retried',
  class: quick,
  input: z.object({}).passthrough(),
  output: z.object({}),
  run: async (_i, ctx) => {
    note('permanent', ctx.attempt);
    throw new PermanentError('the invoice number is malformed', { code: 'bad_invoice' });
  },
});
const flaky = defineTool({
  name: 'always_flaky',
  description: 'always a 503',
  class: quick,
  input: z.object({}).passthrough(),
  output: z.object({}),
  run: async (_i, ctx) => {
    note('always_flaky', ctx.attempt);
    throw new TransientError(`upstream 503 on attempt ${ctx.attempt}`, { code: 'upstream_503' });
  },
});
const long = defineToolClass({ name: 'long', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '20s', maxDuration: '30s' });
const waitForCancel = defineTool({
  name: 'wait_for_cancel',
  description: 'runs until its signal aborts',
  class: long,
  input: z.object({}).passthrough(),
  output: z.object({}),
  run: async (_i, ctx) => {
    const reason = await abortCode(ctx.signal);
    note('wait_for_cancel', ctx.attempt, reason);
    throw ctx.signal.reason;
  },
});
const after = defineTool({
  name: 'after',
  description: 'must never run after a cancel',
  class: long,
  input: z.object({}).passthrough(),
  output: z.object({}),
  run: async (_i, ctx) => {
    note('after', ctx.attempt);
    return {};
  },
});

const wf = (name: string, ...tools: ToolStepOptions['tool'][]) =>
  defineWorkflow({ name, input: z.object({}).passthrough(), steps: tools.map((tool) => ({ tool })) });

describe('retries, timeouts and permanent errors', () => {
  let r: Ratchet;
  beforeAll(async () => {
    r = await createRatchet({
      dataDir: ':memory:',
      logger: silentLogger(),
      workflows: [wf('timeout', slowThenFast), wf('permanent', permanent), wf('exhaust', flaky), wf('cancel', waitForCancel, after)],
    });
    await r.worker({ pollIntervalMs: 50 }).start();
  });
  afterAll(async () => {
    await r.close();
  });

  const settle = async (id: string, timeoutMs = 20_000): Promise<RunView> => {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const run = (await r.getRun(id))!;
      if (['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state)) return run;
      if (Date.now() > until) throw new Error(`run still ${run.state}`);
      await new Promise((res) => setTimeout(res, 25));
    }
  };

  it('a tool past its timeout is aborted (reason timeout) and retried, even when it ignores the abort', async () => {
    const { id } = await r.submit('timeout', {});
    const run = await settle(id);
    expect(run.state).toBe('succeeded');
    expect(run.result).toEqual({ attempt: 2 });
    expect(calls.slow_then_fast).toContainEqual({ attempt: 1, reason: 'timeout' });
    const ev = await r.events(id);
    const retry = ev.find((e) => e.type === 'retry_scheduled')!;
    expect(retry.data).toMatchObject({ delayMs: 50, error: { code: 'timeout', kind: 'timeout', attempt: 1 } });
  });

  it('a PermanentError is not retried: the run fails at once with the error kept', async () => {
    const { id } = await r.submit('permanent', {});
    const run = await settle(id);
    expect(run.state).toBe('failed');
    expect(calls.permanent).toHaveLength(1);
    expect(run.error).toMatchObject({ code: 'bad_invoice', kind: 'permanent', message: 'the invoice number is malformed' });
    expect(run.stages[0]!.lastError).toMatchObject({ code: 'bad_invoice' });
  });

  it('when attempts run out the run fails with the last error, and every attempt is in the events with its delay', async () => {
    const { id } = await r.submit('exhaust', {});
    const run = await settle(id);
    expect(run.state).toBe('failed');
    expect(calls.always_flaky!.map((c) => c.attempt)).toEqual([1, 2, 3]);
    expect(run.error).toMatchObject({
      code: 'attempts_exhausted',
      attempts: 3,
      lastError: { code: 'upstream_503', message: 'upstream 503 on attempt 3' },
    });
    const ev = await r.events(id);
    const retries = ev.filter((e) => e.type === 'retry_scheduled');
    expect(retries.map((e) => (e.data as { delayMs: number }).delayMs)).toEqual([50, 100]);
    expect(retries.map((e) => (e.data as { error: { message: string } }).error.message)).toEqual([
      'upstream 503 on attempt 1',
      'upstream 503 on attempt 2',
    ]);
    expect(ev.filter((e) => e.type === 'job_claimed').map((e) => e.attempt)).toEqual([1, 2, 3]);
    expect(ev.find((e) => e.type === 'stage_failed')!.data).toMatchObject({ decision: 'attempts_exhausted' });
  });

  it('cancel aborts the running tool with reason cancelled at its next heartbeat, and nothing after it is claimed', async () => {
    const { id } = await r.submit('cancel', {});
    for (let i = 0; i < 200 && (await r.getRun(id))!.stages[0]!.state !== 'running'; i++) await new Promise((res) => setTimeout(res, 25));
    const res = await r.cancel(id);
    expect(res).toMatchObject({ cancelled: true, previousState: 'running' });
    expect(res!.runningStageIds).toHaveLength(1);
    const t0 = Date.now();
    for (let i = 0; i < 200 && !calls.wait_for_cancel; i++) await new Promise((res2) => setTimeout(res2, 25));
    expect(calls.wait_for_cancel).toEqual([{ attempt: 1, reason: 'cancelled' }]);
    expect(Date.now() - t0).toBeLessThan(2 * 1000 + 1000);
    await new Promise((res2) => setTimeout(res2, 300));
    const run = (await r.getRun(id))!;
    expect(run.state).toBe('cancelled');
    expect(run.stages.map((s) => s.state)).toEqual(['cancelled', 'cancelled']);
    expect(calls.after).toBeUndefined();
  });

  it('bad input to submit is a typed error naming the path, and writes nothing', async () => {
    const strict = await createRatchet({
      dataDir: ':memory:',
      logger: silentLogger(),
      workflows: [defineWorkflow({ name: 'strict', input: z.object({ invoiceId: z.string() }), steps: [{ tool: permanent }] })],
    });
    try {
      const count = async () => (await strict.store.db.query('SELECT (SELECT count(*) FROM ratchet.runs)::int AS n'))[0]!.n;
      await expect(strict.submit('strict', { invoiceId: 42 })).rejects.toMatchObject({ code: 'invalid_input', path: 'input.invoiceId' });
      await expect(strict.submit('nope', {})).rejects.toMatchObject({ code: 'invalid_input', details: { reason: 'unknown_workflow' } });
      await expect(strict.submit('strict', { invoiceId: 'a\u0000b' })).rejects.toBeInstanceOf(InvalidInputError);
      await expect(strict.submit('strict', { invoiceId: 'x' }, { deadline: '-5s' })).rejects.toBeInstanceOf(Error);
      expect(await count()).toBe(0);
    } finally {
      await strict.close();
    }
  });
});

describe('a next step whose input is not JSON', () => {
  it('fails the next step (and the run) with step_input_failed after the stage succeeded, instead of retrying the tool', async () => {
    let runs = 0;
    const counted = defineTool({
      name: 'counted',
      description: 'counts its runs',
      class: long,
      input: z.object({}).passthrough(),
      output: z.object({}).passthrough(),
      run: async () => {
        runs++;
        return {};
      },
    });
    const r2 = await createRatchet({
      dataDir: ':memory:',
      logger: silentLogger(),
      workflows: [
        defineWorkflow({
          name: 'bad_next',
          input: z.object({}).passthrough(),
          steps: [{ tool: counted }, { tool: after, input: () => ({ when: new Date() }) }],
        }),
      ],
    });
    try {
      await r2.worker({ pollIntervalMs: 50 }).start();
      const { id } = await r2.submit('bad_next', {});
      let run = (await r2.getRun(id))!;
      for (let i = 0; i < 200 && run.state !== 'failed'; i++) {
        await new Promise((res) => setTimeout(res, 25));
        run = (await r2.getRun(id))!;
      }
      expect(run.state).toBe('failed');
      expect(run.error).toMatchObject({ code: 'step_input_failed' });
      expect(run.stages.map((s) => s.state)).toEqual(['succeeded', 'failed']);
      expect(run.stages[1]!.lastError).toMatchObject({ code: 'step_input_failed' });
      expect(runs).toBe(1);
    } finally {
      await r2.close();
    }
  });
});

describe('a changed definition', () => {
  it("a worker without the run's version leaves it (no attempt spent, explain names the hash); one with it finishes it", async () => {
    const dir = `${process.env.TMPDIR ?? '/tmp'}/ratchet-defchange-${process.pid}`;
    const input = z.object({}).passthrough();
    const v1 = defineWorkflow({ name: 'doc', input, steps: [{ tool: after }] });
    const changed = defineWorkflow({ name: 'doc', input, steps: [{ tool: after }, { tool: after, name: 'again' }] }); // a step added, version not bumped
    const v2 = defineWorkflow({ name: 'doc', version: 2, input, steps: [{ tool: after }, { tool: after, name: 'again' }] });
    expect(new Set([v1.hash, changed.hash, v2.hash]).size).toBe(3);
    const old = await createRatchet({ dataDir: dir, logger: silentLogger(), workflows: [v1] });
    const { id } = await old.submit('doc', {});
    await old.close();
    try {
      const next = await createRatchet({ dataDir: dir, logger: silentLogger(), workflows: [changed] });
      try {
        await next.worker({ pollIntervalMs: 50 }).start();
        await new Promise((res) => setTimeout(res, 600)); // many polls
        const run = (await next.getRun(id))!;
        expect(run.state).toBe('queued');
        expect(run.stages.map((s) => [s.state, s.attempt])).toEqual([['queued', 0]]);
        const why = await next.explain(id);
        expect(why.verdict).toBe('queued_no_worker_for_version');
        expect(why.evidence).toMatchObject({ workflow: 'doc', definitionHash: v1.hash, workersWithDefinition: 0, workersServingClass: 1 });
        expect(why.summary).toContain(v1.hash);
      } finally {
        await next.close();
      }
      const both = await createRatchet({ dataDir: dir, logger: silentLogger(), workflows: [v1, v2] });
      try {
        await both.worker({ pollIntervalMs: 50 }).start();
        let run = (await both.getRun(id))!;
        for (let i = 0; i < 200 && run.state !== 'succeeded'; i++) {
          await new Promise((res) => setTimeout(res, 25));
          run = (await both.getRun(id))!;
        }
        expect(run.state).toBe('succeeded');
        expect(run.stages.map((s) => [s.name, s.attempt])).toEqual([['after', 1]]); // v1's one step, first attempt
        expect((await both.submit('doc', {})).id).not.toBe(id);
        expect(both.registry.get('doc')).toBe(v2); // a new run starts the newest
      } finally {
        await both.close();
      }
    } finally {
      const { rmSync } = await import('node:fs');
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
