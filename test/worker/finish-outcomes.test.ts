import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createServer, type ApiServer } from '../../src/api/server.js';
import { formatRun } from '../../src/cli/api/format.js';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import type { Worker } from '../../src/worker/worker.js';
import { TransientError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { DatabaseUnavailableError, type Db } from '../../src/store/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * How a worker ends an attempt when the finish meets real operations, in one process on real
 * PostgreSQL: a finish whose answer is lost after it committed (the fast path and a retry),
 * deadlocks and serialisation failures raised by the server, a result PostgreSQL refuses,
 * maxElapsed measured up to the failure's decision, and the tool's effect key kept and shown.
 */
const fin = defineToolClass({
  name: 'fin',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '10s',
  maxDuration: '30s',
  retry: { maxAttempts: 3, backoff: { initial: '50ms', jitter: 0 } },
});
const finOnce = defineToolClass({
  name: 'fin_once',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '10s',
  maxDuration: '30s',
  retry: { maxAttempts: 1 },
});
const elapsed = defineToolClass({
  name: 'fin_elapsed',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '10s',
  maxDuration: '30s',
  retry: { maxAttempts: 5, backoff: { initial: '100ms', jitter: 0 }, maxElapsed: '1s' },
});

const calls: Record<string, number[]> = {};
const note = (tool: string, attempt: number) => (calls[tool] ??= []).push(attempt);
const anyIn = z.object({}).passthrough();
const tool = (name: string, cls: typeof fin, run: (attempt: number) => Promise<unknown> | unknown, out: z.ZodType = anyIn) =>
  defineTool({
    name,
    description: name,
    class: cls,
    input: anyIn,
    output: out,
    run: async (_i, ctx) => {
      note(name, ctx.attempt);
      return run(ctx.attempt);
    },
  });

let gate: () => void = () => {};
const keyed = defineTool({
  name: 'keyed_effect',
  description: 'derives its key from the order; waits at a gate after beginEffect',
  class: fin,
  input: z.object({ order: z.number() }),
  output: z.object({ ok: z.boolean() }),
  idempotencyKey: (i) => `order:${i.order}:create`,
  run: async (_i, ctx) => {
    ctx.beginEffect('create-request-1');
    await new Promise<void>((resolve) => {
      gate = resolve;
    });
    return { ok: true };
  },
});

const unstorableTool = tool('unstorable', fin, () => ({ text: 'fine' }), z.object({ text: z.string() }));

const workflows = [
  defineWorkflow({
    name: 'lost_fast',
    input: anyIn,
    steps: [{ tool: tool('lf_first', fin, () => ({})) }, { tool: tool('lf_second', finOnce, () => ({})) }],
  }),
  defineWorkflow({
    name: 'lost_retry',
    input: anyIn,
    steps: [
      {
        tool: tool('lr_flaky', fin, (a) => {
          if (a === 1) throw new TransientError('503 once');
          return {};
        }),
      },
    ],
  }),
  defineWorkflow({ name: 'conflicted', input: anyIn, steps: [{ tool: tool('conflicted', fin, () => ({})) }] }),
  defineWorkflow({
    name: 'unstorable',
    input: anyIn,
    steps: [{ tool: unstorableTool }],
  }),
  // The same refusal in a step that keeps its failures as values: the run goes on with { ok: false, error }.
  defineWorkflow({
    name: 'unstorable_kept',
    input: anyIn,
    steps: [
      { name: 'kept', continueOnError: true, tool: unstorableTool },
      { name: 'after', tool: tool('after_kept', fin, () => ({ went: 'on' })), input: () => ({}) },
    ],
  }),
  defineWorkflow({
    name: 'elapsed',
    input: anyIn,
    steps: [
      {
        tool: tool('slow_fail', elapsed, async () => {
          await new Promise((r) => setTimeout(r, 1500));
          throw new TransientError('still down');
        }),
      },
    ],
  }),
  defineWorkflow({ name: 'keyed', input: z.object({ order: z.number() }), steps: [{ tool: keyed }] }),
];

describe('finishes under real operations (PostgreSQL, one process)', () => {
  let db: TestDatabase;
  let r: Ratchet;
  /** Set to drop the answer of the next finish statement whose rows match, after it committed. */
  let dropAnswer: ((rows: { outcome: string; nextSeq: number | null; claimNext: boolean }[]) => boolean) | null = null;
  let dropped = 0;
  let w: Worker;

  beforeAll(async () => {
    db = await createTestDatabase('finish_outcomes');
    r = await createRatchet({ databaseUrl: db.url, workflows, logger: silentLogger() });
    const real: Db['query'] = r.store.db.query.bind(r.store.db);
    // A Queryable that commits, then loses the answer: what a reset after the statement was sent does.
    r.store.db.query = (async (text: string, params?: readonly unknown[], name?: string) => {
      const out = await real(text, params, name);
      // Either finish statement (the light one takes plain batches: PERF-NOTES §12); its retry then goes light and full.
      if ((name === 'ratchet_finish' || name === 'ratchet_finish_light') && dropAnswer && dropAnswer(JSON.parse(params![1] as string))) {
        dropAnswer = null;
        dropped++;
        throw new DatabaseUnavailableError(new Error('Connection terminated unexpectedly (answer lost after commit)'));
      }
      return out;
    }) as Db['query'];
    w = r.worker({ pollIntervalMs: 50 });
    await w.start();
  });
  afterAll(async () => {
    await r?.close();
    await db?.drop();
  });

  const ended = async (id: string, timeoutMs = 30_000): Promise<RunView> => {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const run = (await r.getRun(id))!;
      if (['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state)) return run;
      if (Date.now() > until) throw new Error(`run still ${run.state}: ${JSON.stringify(run.stages)}`);
      await new Promise((res) => setTimeout(res, 25));
    }
  };
  const types = async (id: string) => (await r.events(id)).map((e) => e.type);
  /** Waits until `n` more attempts have ended in the worker (a retried finish may end after its run). */
  const attemptsEnd = async (before: number, n: number) => {
    const total = () => Object.values(w.ended).reduce((a, b) => a + b, 0);
    for (let i = 0; i < 400 && total() < before + n; i++) await new Promise((res) => setTimeout(res, 25));
    expect(total()).toBe(before + n);
    return w.ended;
  };
  const endedSoFar = () => Object.values(w.ended).reduce((a, b) => a + b, 0);

  it('a fast-path finish whose answer is lost: the retried finish learns it claimed stage 2 and runs it, no attempt spent (maxAttempts 1)', async () => {
    dropped = 0;
    dropAnswer = (rows) => rows.some((x) => x.nextSeq === 2 && x.claimNext);
    const before = endedSoFar();
    const rejected = w.ended.rejected;
    const { id } = await r.submit('lost_fast', {});
    const run = await ended(id);
    await attemptsEnd(before, 2);
    expect(w.ended.rejected).toBe(rejected);
    expect(dropped).toBe(1);
    expect(run.state).toBe('succeeded');
    expect(run.stages.map((s) => [s.state, s.attempt])).toEqual([
      ['succeeded', 1],
      ['succeeded', 1],
    ]);
    expect(calls.lf_second).toEqual([1]);
    const ev = await r.events(id);
    expect(ev.map((e) => e.type)).not.toContain('result_rejected');
    const second = (await r.store.getRun(id))!.stages[1]!;
    expect(ev.filter((e) => e.type === 'job_claimed' && e.stageId === second.id).map((e) => e.data)).toEqual([
      expect.objectContaining({ fastPath: true, byFence: expect.any(String) }),
    ]);
    expect(ev.filter((e) => e.type === 'finish_replayed')).toHaveLength(1);
  });

  it('a retry-scheduled finish whose answer is lost counts as scheduled: no result_rejected', async () => {
    dropped = 0;
    dropAnswer = (rows) => rows.some((x) => x.outcome === 'queued');
    const before = endedSoFar();
    const { retry, rejected } = w.ended;
    const { id } = await r.submit('lost_retry', {});
    const run = await ended(id);
    await attemptsEnd(before, 2);
    expect(w.ended).toMatchObject({ retry: retry + 1, rejected });
    expect(dropped).toBe(1);
    expect(run.state).toBe('succeeded');
    expect(calls.lr_flaky).toEqual([1, 2]);
    const ev = await types(id);
    expect(ev).not.toContain('result_rejected');
    expect(ev.filter((t) => t === 'retry_scheduled')).toHaveLength(1);
  });

  it('a deadlock (40P01) then a serialisation failure (40001) from the server: the finish is asked again at once, the tool runs once', async () => {
    await db.query(`CREATE SEQUENCE public.finish_faults`);
    await db.query(`CREATE FUNCTION public.finish_fault() RETURNS trigger LANGUAGE plpgsql AS $$
      DECLARE n bigint := nextval('public.finish_faults');
      BEGIN
        IF n = 1 THEN RAISE EXCEPTION 'injected deadlock' USING ERRCODE = '40P01'; END IF;
        IF n = 2 THEN RAISE EXCEPTION 'injected serialisation failure' USING ERRCODE = '40001'; END IF;
        RETURN NEW;
      END $$`);
    await db.query(`CREATE TRIGGER finish_fault BEFORE UPDATE ON ratchet.stages FOR EACH ROW
      WHEN (OLD.state = 'running' AND NEW.state = 'succeeded' AND OLD.tool = 'conflicted') EXECUTE FUNCTION public.finish_fault()`);
    try {
      const { id } = await r.submit('conflicted', {});
      const run = await ended(id);
      expect(run.state).toBe('succeeded');
      expect(calls.conflicted).toEqual([1]);
      expect(run.stages[0]!.attempt).toBe(1);
      expect((await db.query<{ n: string }>(`SELECT last_value::text AS n FROM public.finish_faults`))[0]!.n).toBe('3');
      expect(await types(id)).not.toContain('result_rejected');
    } finally {
      await db.query(`DROP TRIGGER finish_fault ON ratchet.stages`);
    }
  });

  it('a result PostgreSQL cannot store fails the stage permanently with a clear lastError, without running the tool again', async () => {
    // A lone surrogate or a NUL is refused before the finish (toJsonText: invalid_output); what is left is
    // PostgreSQL's own refusal of a row (a data exception, class 22), raised here by a trigger on the finish.
    await db.query(`CREATE FUNCTION public.unstorable_fault() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN RAISE EXCEPTION 'injected: unsupported Unicode escape sequence' USING ERRCODE = '22P05'; END $$`);
    await db.query(`CREATE TRIGGER unstorable_fault BEFORE UPDATE ON ratchet.stages FOR EACH ROW
      WHEN (OLD.state = 'running' AND NEW.state = 'succeeded' AND OLD.tool = 'unstorable') EXECUTE FUNCTION public.unstorable_fault()`);
    try {
      const { id } = await r.submit('unstorable', {});
      const run = await ended(id, 20_000);
      expect(run.state).toBe('failed');
      expect(calls.unstorable).toEqual([1]);
      calls.unstorable = [];
      expect(run.stages[0]).toMatchObject({ state: 'failed', attempt: 1, lastError: { code: 'result_not_storable', kind: 'permanent' } });
      expect((run.stages[0]!.lastError as { message: string }).message).toMatch(/cannot be stored/);
      expect(run.error).toMatchObject({ code: 'result_not_storable' });

      // Under continueOnError the refusal is a failure kept as a value, as any failure for good is: the run goes on.
      const kept = await r.submit('unstorable_kept', {});
      const keptRun = await ended(kept.id, 20_000);
      expect(keptRun.state).toBe('succeeded');
      expect(keptRun.stages.map((s) => s.state)).toEqual(['failed', 'succeeded']);
      expect(keptRun.stages[0]!.lastError).toMatchObject({ code: 'result_not_storable' });
      expect(calls.after_kept).toEqual([1]);
    } finally {
      await db.query(`DROP TRIGGER unstorable_fault ON ratchet.stages`);
    }
  });

  it('maxElapsed counts from the first claim to the failure being decided, not to the claim', async () => {
    const { id } = await r.submit('elapsed', {});
    const run = await ended(id);
    expect(run.state).toBe('failed');
    expect(calls.slow_fail).toEqual([1]); // 1.5 s of work already passed maxElapsed (1 s): no second attempt
    expect(run.error).toMatchObject({ code: 'max_elapsed', attempts: 1 });
  });

  it('the key a tool derived is stored when its effect starts, kept by the finish, and shown by getRun, GET /v1/runs/:id, its events and status', async () => {
    const { id } = await r.submit('keyed', { order: 42 });
    let during: RunView | null = null;
    for (let i = 0; i < 400; i++) {
      during = (await r.getRun(id))!;
      if (during.stages[0]!.effectKey) break;
      await new Promise((res) => setTimeout(res, 25));
    }
    expect(during!.stages[0]).toMatchObject({ state: 'running', effectKey: 'order:42:create' }); // durable before the tool answers
    gate();
    const run = await ended(id);
    expect(run.state).toBe('succeeded');
    expect(run.stages[0]!.effectKey).toBe('order:42:create');

    const ev = await r.events(id);
    expect(ev.find((e) => e.type === 'tool_request_started')!.data).toMatchObject({
      requestId: 'create-request-1',
      effectKey: 'order:42:create',
    });
    expect(ev.find((e) => e.type === 'stage_succeeded')!.data).toMatchObject({ effectKey: 'order:42:create' });

    let server: ApiServer | undefined;
    try {
      server = await createServer({ ratchet: r, tokens: ['t0123456789abcdef'], port: 0 });
      const res = await fetch(`${server.url}/v1/runs/${id}`, { headers: { authorization: 'Bearer t0123456789abcdef' } });
      expect(res.status).toBe(200);
      const body = (await res.json()) as Parameters<typeof formatRun>[0];
      expect(body.stages[0]).toMatchObject({ effectKey: 'order:42:create', idempotencyKey: `${id}:1:keyed_effect` });
      expect(formatRun(body)).toContain('key order:42:create');
    } finally {
      await server?.close();
    }
  });
});
