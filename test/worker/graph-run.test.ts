import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { z } from 'zod';
import { createServer, type ApiServer } from '../../src/api/server.js';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import { PermanentError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import type { Worker } from '../../src/worker/worker.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * The run graph runs (issue 11, phase 2), end to end on PostgreSQL with two workers: a fan-out
 * and its join (once, after both, with both results), `when` and skip propagation, several
 * sinks (the run's result by step name), continueOnError as a value, and the group failure
 * (a running sibling's signal aborts with `cancelled`, the join is never claimed); a user cancel
 * (POST /v1/runs/:id/cancel) during a fan-out of three; GET /v1/runs/:id shows each stage's deps;
 * a linear stretch handed over by the finishing statement (job_claimed fastPath), a join woken
 * through the transport.
 */
const g = defineToolClass({
  name: 'graph_io',
  lease: '3s',
  heartbeat: '500ms',
  jitter: '100ms',
  timeout: '20s',
  maxDuration: '30s',
  retry: { maxAttempts: 2, backoff: { initial: '50ms', jitter: 0 } },
});
const any = z.object({}).passthrough();
const calls: Record<string, { attempt: number; input: unknown; reason?: string }[]> = {};
const note = (name: string, attempt: number, input: unknown, reason?: string) =>
  (calls[name] ??= []).push({ attempt, input, ...(reason ? { reason } : {}) });
const tool = (name: string, run: (input: Record<string, unknown>) => unknown | Promise<unknown>) =>
  defineTool({
    name,
    description: name,
    class: g,
    input: any,
    output: z.unknown(),
    run: async (input, ctx) => {
      note(name, ctx.attempt, input);
      return run(input);
    },
  });
const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));

const a = tool('a', () => ({ a: 1 }));
const b = tool('b', async () => {
  await pause(50);
  return 'B';
});
const c = tool('c', () => 'C');
const join = tool('join', (input) => ({ joined: input }));
const fanJoin = defineWorkflow({
  name: 'fan_join',
  input: any,
  steps: [
    { tool: a },
    { tool: b, after: ['a'] },
    { tool: c, after: ['a'] },
    { tool: join, after: ['b', 'c'], input: ({ results }) => results },
  ],
});

const s = tool('s', () => 'S');
const x = tool('x', () => 'X');
const y = tool('y', () => 'Y');
const z1 = tool('z', (input) => input);
const branches = defineWorkflow({
  name: 'branches',
  input: z.object({ go: z.boolean() }),
  steps: [
    { tool: s },
    { tool: x, after: ['s'], when: ({ input }) => (input as { go: boolean }).go },
    { tool: y, after: ['x'] }, // waits only for x: skipped with it
    { tool: z1, after: ['s', 'x'], input: ({ results }) => ({ seen: Object.keys(results).sort() }) }, // mixed: runs
  ],
});

const bad = tool('bad', () => {
  throw new PermanentError('no luck', { code: 'bad_luck' });
});
const after = tool('after_bad', (input) => input);
const keepGoing = defineWorkflow({
  name: 'keep_going',
  input: any,
  steps: [
    { tool: bad, continueOnError: true },
    { tool: after, input: ({ results }) => ({ got: results.bad }) },
  ],
});

// Retry after a failure kept as a value: the retry takes the stage that failed the run, not the earlier kept one.
let flakyFails = true;
const flaky = tool('flaky', () => {
  if (flakyFails) throw new PermanentError('not yet', { code: 'not_yet' });
  return 'F';
});
const valueThenFail = defineWorkflow({
  name: 'value_then_fail',
  input: any,
  steps: [{ tool: bad, continueOnError: true }, { tool: flaky }],
});

let slowStarted!: () => void;
const slowRunning = new Promise<void>((r) => {
  slowStarted = r;
});
const slow = defineTool({
  name: 'slow',
  description: 'runs until its signal aborts',
  class: g,
  input: any,
  output: z.unknown(),
  run: async (input, ctx) => {
    const reason = await new Promise<string>((resolve) => {
      ctx.signal.addEventListener('abort', () => resolve((ctx.signal.reason as { code: string }).code), { once: true });
      slowStarted();
    });
    note('slow', ctx.attempt, input, reason);
    throw ctx.signal.reason;
  },
});
const boom = tool('boom', async () => {
  await slowRunning; // fail while the sibling runs
  throw new PermanentError('boom', { code: 'boom' });
});
const never = tool('never', () => 'never');
const group = defineWorkflow({
  name: 'group_failure',
  input: any,
  steps: [{ tool: slow }, { tool: boom, after: [] }, { tool: never, after: ['slow', 'boom'] }],
});

// A user cancel during a fan-out: three branches hold until their signal aborts; the join must never be claimed.
let heldStarted = 0;
const held = (name: string) =>
  defineTool({
    name,
    description: 'runs until its signal aborts',
    class: g,
    input: any,
    output: z.unknown(),
    run: async (input, ctx) => {
      const reason = await new Promise<string>((resolve) => {
        ctx.signal.addEventListener('abort', () => resolve((ctx.signal.reason as { code: string }).code), { once: true });
        heldStarted++;
      });
      note(name, ctx.attempt, input, reason);
      throw ctx.signal.reason;
    },
  });
const neverJoin = tool('never_join', () => 'never');
const cancelFan = defineWorkflow({
  name: 'cancel_fan',
  input: any,
  steps: [
    { tool: held('h1'), after: [] },
    { tool: held('h2'), after: [] },
    { tool: held('h3'), after: [] },
    { tool: neverJoin, after: ['h1', 'h2', 'h3'] },
  ],
});

// A linear stretch: each finish hands the next stage over in its own statement (the fast path).
const l1 = tool('l1', () => 1);
const l2 = tool('l2', () => 2);
const l3 = tool('l3', () => 3);
const linear = defineWorkflow({ name: 'linear3', input: any, steps: [{ tool: l1 }, { tool: l2 }, { tool: l3 }] });

const TOKEN = 't0123456789abcdef';
const auth = { headers: { authorization: `Bearer ${TOKEN}` } };

describe('the run graph runs (PostgreSQL, two workers)', () => {
  let db: TestDatabase;
  let r: Ratchet;
  const workers: Worker[] = [];
  let api: ApiServer;
  beforeAll(async () => {
    db = await createTestDatabase('graph_run');
    r = await createRatchet({
      databaseUrl: db.url,
      workflows: [fanJoin, branches, keepGoing, group, valueThenFail, cancelFan, linear],
      logger: silentLogger(),
    });
    for (let i = 0; i < 2; i++) {
      const w = r.worker({ pollIntervalMs: 50, concurrency: 4 });
      await w.start();
      workers.push(w);
    }
    api = await createServer({ ratchet: r, tokens: [TOKEN], port: 0 });
  });
  afterAll(async () => {
    await api?.close();
    await r?.close();
    await db?.drop();
  });
  const ended = async (id: string): Promise<RunView> => {
    for (let i = 0; i < 800; i++) {
      const run = (await r.getRun(id))!;
      if (['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state)) return run;
      await pause(25);
    }
    throw new Error('run did not end');
  };
  const types = async (id: string) => (await r.events(id)).map((e) => e.type);

  it('a fan-out and its join: the join runs once, after both branches, with both results; its value is the run result', async () => {
    const { id } = await r.submit('fan_join', {});
    const run = await ended(id);
    expect(run.state).toBe('succeeded');
    expect(run.stages.map((st) => [st.name, st.state])).toEqual([
      ['a', 'succeeded'],
      ['b', 'succeeded'],
      ['c', 'succeeded'],
      ['join', 'succeeded'],
    ]);
    expect(calls.join).toHaveLength(1);
    expect(calls.join![0]!.input).toEqual({ a: { a: 1 }, b: 'B', c: 'C' });
    expect(run.result).toEqual({ joined: { a: { a: 1 }, b: 'B', c: 'C' } });
    expect((await types(id)).filter((t) => t === 'run_succeeded')).toHaveLength(1);
  });

  it('when false skips a stage and those that wait only for it; a stage with a dependency that ran runs; sinks give the result by name', async () => {
    const { id } = await r.submit('branches', { go: false });
    const run = await ended(id);
    expect(run.state).toBe('succeeded');
    expect(run.stages.map((st) => [st.name, st.state])).toEqual([
      ['s', 'succeeded'],
      ['x', 'skipped'],
      ['y', 'skipped'],
      ['z', 'succeeded'],
    ]);
    expect(run.result).toEqual({ z: { seen: ['s'] } }); // the skipped sink y is absent
    const ev = await types(id);
    expect(ev.filter((t) => t === 'stage_skipped')).toHaveLength(2);
    expect(calls.x).toBeUndefined();
    expect(calls.y).toBeUndefined();

    const go = await ended((await r.submit('branches', { go: true })).id);
    expect(go.state).toBe('succeeded');
    expect(go.result).toEqual({ y: 'Y', z: { seen: ['s', 'x'] } });
  });

  it('continueOnError: a failure for good is a value later steps see; the run goes on', async () => {
    const run = await ended((await r.submit('keep_going', {})).id);
    expect(run.state).toBe('succeeded');
    expect(run.stages.map((st) => st.state)).toEqual(['failed', 'succeeded']);
    expect(run.result).toMatchObject({ got: { ok: false, error: { code: 'bad_luck' } } });
  });

  it('retry after a failure kept as a value re-runs the stage that failed the run, never the kept one', async () => {
    const { id } = await r.submit('value_then_fail', {});
    const failed = await ended(id);
    expect(failed.state).toBe('failed');
    expect(failed.error).toMatchObject({ code: 'not_yet' });
    const badCalls = calls.bad?.length ?? 0;
    flakyFails = false;
    expect((await r.retry(id))?.retried).toBeTruthy();
    const run = await ended(id);
    expect(run.state).toBe('succeeded');
    expect(run.stages.map((st) => [st.name, st.state])).toEqual([
      ['bad', 'failed'],
      ['flaky', 'succeeded'],
    ]);
    expect(calls.bad?.length ?? 0).toBe(badCalls); // the kept failure is not run again
    expect(run.result).toBe('F');
  });

  it('a failure for good fails the run and cancels the running sibling (its signal aborts with cancelled); the join is never claimed', async () => {
    const { id } = await r.submit('group_failure', {});
    const run = await ended(id);
    expect(run.state).toBe('failed');
    expect(run.error).toMatchObject({ code: 'boom' });
    for (let i = 0; i < 200 && !calls.slow; i++) await pause(25);
    expect(calls.slow).toEqual([{ attempt: 1, input: {}, reason: 'cancelled' }]);
    await pause(300);
    const after = (await r.getRun(id))!;
    expect(after.stages.map((st) => [st.name, st.state])).toEqual([
      ['slow', 'cancelled'],
      ['boom', 'failed'],
      ['never', 'cancelled'],
    ]);
    expect(calls.never).toBeUndefined();
    const ev = await r.events(id);
    expect(ev.find((e) => e.type === 'stage_cancelled')?.data).toMatchObject({ previousState: 'running', reason: 'run_failed' });
  });

  it('GET /v1/runs/:id shows the graph: each stage with its dependencies (seqs) and state', async () => {
    const { id } = await r.submit('fan_join', {});
    await ended(id);
    const body = (await (await fetch(`${api.url}/v1/runs/${id}`, auth)).json()) as {
      stages: { name: string; deps: number[]; seq: number; state: string }[];
    };
    const seq = (name: string) => body.stages.find((st) => st.name === name)!.seq;
    expect(body.stages.map((st) => [st.name, st.deps, st.state])).toEqual([
      ['a', [], 'succeeded'],
      ['b', [seq('a')], 'succeeded'],
      ['c', [seq('a')], 'succeeded'],
      ['join', [seq('b'), seq('c')], 'succeeded'],
    ]);
  });

  it('a user cancel during a fan-out: every running branch aborts with cancelled, the join is never claimed, the run ends cancelled', async () => {
    heldStarted = 0;
    const { id } = await r.submit('cancel_fan', {});
    for (let i = 0; i < 400 && heldStarted < 3; i++) await pause(25);
    expect(heldStarted).toBe(3);
    const res = await fetch(`${api.url}/v1/runs/${id}/cancel`, { method: 'POST', ...auth }); // cancel takes no body
    expect(res.status).toBe(200);
    for (let i = 0; i < 400 && ['h1', 'h2', 'h3'].some((n) => !calls[n]); i++) await pause(25);
    for (const n of ['h1', 'h2', 'h3']) expect(calls[n], n).toEqual([{ attempt: 1, input: {}, reason: 'cancelled' }]);
    const run = await ended(id);
    expect(run.state).toBe('cancelled');
    await pause(300);
    const after = (await r.getRun(id))!;
    expect(after.stages.map((st) => [st.name, st.state])).toEqual([
      ['h1', 'cancelled'],
      ['h2', 'cancelled'],
      ['h3', 'cancelled'],
      ['never_join', 'cancelled'],
    ]);
    expect(calls.never_join).toBeUndefined();
    const join = (await r.store.getRun(id))!.stages[3]!;
    expect((await r.events(id)).filter((e) => e.stageId === join.id && e.type === 'job_claimed')).toEqual([]);
  });

  it('a linear stretch is handed over in the finishing statement (fast path); a join falls back to a wake-up', async () => {
    const notify = vi.spyOn(r.transport, 'notify');
    try {
      const lin = await ended((await r.submit('linear3', {})).id);
      expect(lin.state).toBe('succeeded');
      const linStages = (await r.store.getRun(lin.id))!.stages;
      const claims = (await r.events(lin.id)).filter((e) => e.type === 'job_claimed');
      for (const i of [1, 2]) {
        const claim = claims.filter((e) => e.stageId === linStages[i]!.id);
        expect(claim, linStages[i]!.name).toHaveLength(1);
        expect(claim[0]!.data).toMatchObject({ fastPath: true, byStage: linStages[i - 1]!.id });
      }
      const woken = (ids: string[]) => notify.mock.calls.filter((c) => ids.includes((c[1] as { stageId: string }).stageId));
      expect(woken(linStages.slice(1).map((st) => st.id))).toEqual([]); // never through the transport

      const { id } = await r.submit('fan_join', {});
      expect((await ended(id)).state).toBe('succeeded');
      const st = (await r.store.getRun(id))!.stages;
      const joinClaims = (await r.events(id)).filter((e) => e.type === 'job_claimed' && e.stageId === st[3]!.id);
      expect(joinClaims).toHaveLength(1);
      expect((joinClaims[0]!.data as { fastPath?: boolean }).fastPath).toBeUndefined(); // claimed from the queue
      expect(woken([st[3]!.id])).toHaveLength(1); // the last branch's finish woke it once
    } finally {
      notify.mockRestore();
    }
  });
});
