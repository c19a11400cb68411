import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import { PermanentError, TransientError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * `retry` works for every failed run, whatever stage it failed in and however: a next step's
 * input() that threw after the stage before it succeeded, an attempt budget spent, a permanent
 * error in a middle stage. Expired and cancelled runs are resubmitted instead. On PostgreSQL.
 */
const cls = defineToolClass({
  name: 'again',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '10s',
  maxDuration: '30s',
  retry: { maxAttempts: 2, backoff: { initial: '20ms', jitter: 0 } },
});
const runs: Record<string, number> = {};
const open = { input: true, flaky: false, middle: false };
const anyIn = z.object({}).passthrough();
const counted = (name: string, ok: () => boolean, Err: typeof TransientError | typeof PermanentError = TransientError) =>
  defineTool({
    name,
    description: name,
    class: cls,
    input: anyIn,
    output: anyIn,
    run: async (i) => {
      runs[name] = (runs[name] ?? 0) + 1;
      if (!ok()) throw new Err(`${name} is not ready`, { code: `${name}_down` });
      return { from: name, got: i };
    },
  });
const first = counted('first', () => true);
const second = counted('second', () => true);
const flaky = counted('flaky', () => open.flaky);
const middle = counted('middle', () => open.middle, PermanentError);
const last = counted('last', () => true);

const workflows = [
  defineWorkflow({
    name: 'input_throws',
    input: anyIn,
    steps: [
      { tool: first },
      {
        tool: second,
        input: ({ results }) => {
          if (!open.input) throw new Error('the lookup table is not loaded');
          return { previous: results.first };
        },
      },
    ],
  }),
  defineWorkflow({ name: 'exhausted', input: anyIn, steps: [{ tool: flaky }] }),
  defineWorkflow({ name: 'middle_fails', input: anyIn, steps: [{ tool: first, name: 'one' }, { tool: middle }, { tool: last }] }),
  defineWorkflow({ name: 'short_deadline', input: anyIn, deadline: '1h', steps: [{ tool: flaky, name: 'deadline_flaky' }] }),
];

describe('retry of runs failed in different ways (PostgreSQL)', () => {
  let db: TestDatabase;
  let r: Ratchet;
  beforeAll(async () => {
    db = await createTestDatabase('retry_any');
    r = await createRatchet({ databaseUrl: db.url, workflows, logger: silentLogger() });
    await r.worker({ pollIntervalMs: 50 }).start();
  });
  afterAll(async () => {
    await r?.close();
    await db?.drop();
  });
  const ended = async (id: string): Promise<RunView> => {
    for (let i = 0; i < 800; i++) {
      const v = (await r.getRun(id))!;
      if (['succeeded', 'failed', 'cancelled', 'expired'].includes(v.state)) return v;
      await new Promise((res) => setTimeout(res, 25));
    }
    throw new Error('run did not end');
  };

  it("a next step's input() that throws fails that step (not the run between stages); retry computes its input again", async () => {
    open.input = false;
    const { id } = await r.submit('input_throws', { n: 1 });
    const failed = await ended(id);
    expect(failed.state).toBe('failed');
    expect(failed.error).toMatchObject({ code: 'step_input_failed' });
    expect(failed.stages.map((s) => s.state)).toEqual(['succeeded', 'failed']);
    expect(failed.stages[1]!.lastError).toMatchObject({
      code: 'step_input_failed',
      message: expect.stringContaining('the lookup table is not loaded'),
    });
    expect(runs.second).toBeUndefined();

    open.input = true;
    expect(await r.retry(id)).toMatchObject({ retried: true, previousState: 'failed', stage: { seq: 2, tool: 'second' } });
    const done = await ended(id);
    expect(done.state).toBe('succeeded');
    expect(done.result).toEqual({ from: 'second', got: { previous: { from: 'first', got: { n: 1 } } } });
    expect(runs.first).toBe(1); // the stage that succeeded never runs again
    expect(runs.second).toBe(1);
  });

  it('a run whose attempts ran out is retried from that stage with a fresh budget', async () => {
    open.flaky = false;
    const { id } = await r.submit('exhausted', {});
    expect((await ended(id)).error).toMatchObject({ code: 'attempts_exhausted' });
    open.flaky = true;
    expect(await r.retry(id)).toMatchObject({ retried: true, stage: { seq: 1, attemptsUsed: 2 } });
    expect((await ended(id)).state).toBe('succeeded');
  });

  it('a permanent error in a middle stage: retry goes on from that stage and re-plans the stages after it', async () => {
    open.middle = false;
    const { id } = await r.submit('middle_fails', {});
    const failed = await ended(id);
    expect(failed.stages.map((s) => s.state)).toEqual(['succeeded', 'failed', 'cancelled']);
    open.middle = true;
    expect(await r.retry(id)).toMatchObject({ retried: true, stage: { seq: 2 } });
    const done = await ended(id);
    expect(done.stages.map((s) => [s.state, s.attempt])).toEqual([
      ['succeeded', 1],
      ['succeeded', 1],
      ['succeeded', 1],
    ]);
  });

  it('an expired run is not retried (resubmit it); a failed run past its deadline neither', async () => {
    open.flaky = false;
    const { id } = await r.submit('short_deadline', {});
    expect((await ended(id)).state).toBe('failed');
    await r.store.clock.advance(2 * 3_600_000);
    try {
      expect(await r.retry(id)).toMatchObject({ retried: false, reason: 'deadline_passed' });
    } finally {
      await r.store.clock.setOffset(0);
    }
    const cancelled = await r.submit('exhausted', { c: 1 });
    await r.cancel(cancelled.id);
    expect(await r.retry(cancelled.id)).toMatchObject({ retried: false, reason: 'not_failed', previousState: 'cancelled' });
  });
});
