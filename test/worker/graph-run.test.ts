import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
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
 * (a running sibling's signal aborts with `cancelled`, the join is never claimed).
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

describe('the run graph runs (PostgreSQL, two workers)', () => {
  let db: TestDatabase;
  let r: Ratchet;
  const workers: Worker[] = [];
  beforeAll(async () => {
    db = await createTestDatabase('graph_run');
    r = await createRatchet({
      databaseUrl: db.url,
      workflows: [fanJoin, branches, keepGoing, group, valueThenFail],
      logger: silentLogger(),
    });
    for (let i = 0; i < 2; i++) {
      const w = r.worker({ pollIntervalMs: 50, concurrency: 4 });
      await w.start();
      workers.push(w);
    }
  });
  afterAll(async () => {
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
});
