import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow, type ToolStepOptions } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import { settledRun } from '../helpers/settled-run.js';
import { silentLogger } from '../../src/logger.js';
import { Attempt } from '../../src/worker/attempt.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * PERF-NOTES §15 on real PostgreSQL and a worker: a tool's ctx.signal is made when the tool
 * reads it (the executor and tracing do not), and an abort reaches it whether it came before
 * the tool's first read or after.
 */
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const empty = z.object({}).passthrough();
const seen: Record<string, unknown> = {};

/** Reads of Attempt#signal, by stage id (the getter wrapped for this file). */
const reads = new Map<string, number>();
const original = Object.getOwnPropertyDescriptor(Attempt.prototype, 'signal')!;
Object.defineProperty(Attempt.prototype, 'signal', {
  ...original,
  get(this: Attempt) {
    reads.set(this.stage.id, (reads.get(this.stage.id) ?? 0) + 1);
    return original.get!.call(this);
  },
});

const quick = defineToolClass({
  name: 'lazy_quick',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '400ms',
  maxDuration: '30s',
  retry: { maxAttempts: 1 },
});
const quiet = defineTool({
  name: 'quiet',
  description: 'never reads its signal',
  class: quick,
  input: empty,
  output: z.object({ stageId: z.string(), traceparent: z.boolean() }),
  run: async (_i, ctx) => ({ stageId: ctx.stageId, traceparent: typeof ctx.traceparent === 'string' }),
});
const lateReader = defineTool({
  name: 'late_reader',
  description: 'reads its signal only after its timeout aborted the attempt',
  class: quick,
  input: empty,
  output: empty,
  run: async (_i, ctx) => {
    seen.lateMadeBefore = reads.get(ctx.stageId) ?? 0;
    await sleep(900);
    seen.late = { aborted: ctx.signal.aborted, code: (ctx.signal.reason as { code?: string } | undefined)?.code };
    return {};
  },
});
const earlyReader = defineTool({
  name: 'early_reader',
  description: 'reads its signal at once and waits for its abort',
  class: quick,
  input: empty,
  output: empty,
  run: async (_i, ctx) => {
    const signal = ctx.signal;
    seen.earlyAbortedAtStart = signal.aborted;
    seen.early = await new Promise<string>((resolve) =>
      signal.addEventListener('abort', () => resolve((signal.reason as { code: string }).code), { once: true }),
    );
    return {};
  },
});
const wf = (name: string, tool: ToolStepOptions['tool']) => defineWorkflow({ name, input: empty, steps: [{ tool }] });

describe('ctx.signal made at the tool’s first read', () => {
  let db: TestDatabase;
  let r: Ratchet;
  beforeAll(async () => {
    db = await createTestDatabase('lazy_signal');
    r = await createRatchet({
      databaseUrl: db.url,
      workflows: [wf('quiet', quiet), wf('late-reader', lateReader), wf('early-reader', earlyReader)],
      logger: silentLogger(),
    });
    await r.worker({ pollIntervalMs: 50 }).start();
  });
  afterAll(async () => {
    Object.defineProperty(Attempt.prototype, 'signal', original);
    await r.close();
    await db.drop();
  });

  const settled = (id: string, timeoutMs = 20_000): Promise<RunView> => settledRun(r, id, timeoutMs);

  it('a tool that never reads its signal: no one else reads it (no AbortSignal made); its ctx still has the traceparent', async () => {
    const { id } = await r.submit('quiet', {});
    const run = await settled(id);
    expect(run.state).toBe('succeeded');
    const { stageId, traceparent } = run.result as { stageId: string; traceparent: boolean };
    expect(traceparent).toBe(true);
    expect(reads.get(stageId) ?? 0).toBe(0);
  });

  it('an abort before the first read: the signal the tool then reads is aborted, with the reason', async () => {
    const { id } = await r.submit('late-reader', {});
    const run = await settled(id);
    expect(run.state).toBe('failed');
    expect(run.error).toMatchObject({ code: 'attempts_exhausted', lastError: { code: 'timeout' } });
    for (let i = 0; i < 40 && seen.late === undefined; i++) await sleep(50); // the tool reads after the attempt ended
    expect(seen.lateMadeBefore).toBe(0);
    expect(seen.late).toEqual({ aborted: true, code: 'timeout' });
  });

  it('an abort after the first read reaches the listener', async () => {
    const { id } = await r.submit('early-reader', {});
    const run = await settled(id);
    expect(run.state).toBe('failed');
    expect(run.error).toMatchObject({ code: 'attempts_exhausted', lastError: { code: 'timeout' } });
    expect(seen.earlyAbortedAtStart).toBe(false);
    expect(seen.early).toBe('timeout');
  });
});
