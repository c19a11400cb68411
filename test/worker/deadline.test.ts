import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import { TransientError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import type { Worker } from '../../src/worker/worker.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { abortCode } from '../helpers/abort.js';

/**
 * Run deadlines (issue 9, item 7) on real PostgreSQL with the movable database clock: a
 * deadline is the database's now + the duration, and a run past it ends `expired` within one
 * sweep even while none of its stages is claimed (a retry delay, a class no worker serves),
 * and a long stage's attempt is aborted with `run_deadline`.
 */
const SWEEP_MS = 200;
const quick = { lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '5s', maxDuration: '30s' } as const;
const later = defineToolClass({ name: 'dl_later', ...quick, retry: { maxAttempts: 3, backoff: { initial: '1h', max: '1h', jitter: 0 } } });
const orphan = defineToolClass({ name: 'dl_orphan', ...quick });
/** A lease longer than the clock moves in these tests, so advancing it expires no lease. */
const long = defineToolClass({ name: 'dl_long', lease: '1h', heartbeat: '1s', jitter: '200ms', timeout: '2h', maxDuration: '3h' });

const reasons: string[] = [];
const empty = z.object({}).passthrough();
const failOnce = defineTool({
  name: 'fail_once',
  description: 'a 503 on attempt 1',
  class: later,
  input: empty,
  output: empty,
  run: async (_i, ctx) => {
    if (ctx.attempt === 1) throw new TransientError('upstream 503', { code: 'upstream_503' });
    return {};
  },
});
const unserved = defineTool({
  name: 'unserved',
  description: 'no worker serves its class',
  class: orphan,
  input: empty,
  output: empty,
  run: async () => ({}),
});
const waitAbort = defineTool({
  name: 'wait_abort',
  description: 'runs until its signal aborts',
  class: long,
  input: empty,
  output: empty,
  run: async (_i, ctx) => {
    const reason = await abortCode(ctx.signal);
    reasons.push(reason);
    throw ctx.signal.reason;
  },
});
const workflows = [
  defineWorkflow({ name: 'dl-later', input: empty, steps: [{ tool: failOnce }] }),
  defineWorkflow({ name: 'dl-orphan', input: empty, steps: [{ tool: unserved }] }),
  defineWorkflow({ name: 'dl-long', input: empty, steps: [{ tool: waitAbort }] }),
  defineWorkflow({ name: 'dl-default', input: empty, deadline: '10m', steps: [{ tool: unserved }] }),
  // Two roots: one a worker claims, one of a class nobody serves (still queued when the run expires).
  defineWorkflow({
    name: 'dl-pair',
    input: empty,
    steps: [
      { name: 'served', tool: failOnce, after: [] },
      { name: 'unserved', tool: unserved, after: [] },
    ],
  }),
];

describe('run deadlines', () => {
  let db: TestDatabase;
  let r: Ratchet;
  let w: Worker | null = null;
  beforeAll(async () => {
    db = await createTestDatabase('deadline');
    r = await createRatchet({ databaseUrl: db.url, workflows, logger: silentLogger() });
  });
  afterEach(async () => {
    await w?.stop({ graceMs: 0 });
    w = null;
  });
  afterAll(async () => {
    await r.close();
    await db.drop();
  });

  async function until(what: string, timeoutMs: number, probe: () => Promise<RunView | null | false>): Promise<RunView> {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const v = await probe();
      if (v) return v;
      if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
      await new Promise((res) => setTimeout(res, 25));
    }
  }
  const state = (id: string, s: string) => async () => {
    const run = await r.getRun(id);
    return run?.state === s ? run : null;
  };
  async function startWorker(classes: string[]): Promise<Worker> {
    w = r.worker({ classes, pollIntervalMs: 50, sweepIntervalMs: SWEEP_MS });
    await w.start();
    return w;
  }
  const types = async (id: string) => (await r.events(id)).map((e) => e.type);

  it('a deadline is the database clock plus the duration (submit option and workflow default), not the submitting process clock', async () => {
    await r.store.clock.advance(86_400_000); // the database is a day ahead of this process
    const now = (await r.store.clock.now()).getTime();
    const a = await r.submit('dl-orphan', {}, { deadline: '10m' });
    const b = await r.submit('dl-default', {});
    for (const id of [a.id, b.id]) {
      const deadline = (await r.getRun(id))!.deadline!.getTime();
      expect(deadline - now).toBeGreaterThanOrEqual(600_000);
      expect(deadline - now).toBeLessThan(600_000 + 10_000);
    }
    const at = new Date(now + 3_600_000); // an absolute Date is kept as given
    const c = await r.submit('dl-orphan', {}, { deadline: at });
    expect((await r.getRun(c.id))!.deadline!.getTime()).toBe(at.getTime());
    await r.cancel(a.id);
    await r.cancel(b.id);
    await r.cancel(c.id);
  });

  it('a bad deadline is a typed error and writes nothing', async () => {
    const count = async () => Number((await db.query('SELECT count(*)::int AS n FROM ratchet.runs'))[0]!.n);
    const before = await count();
    const stages = [{ name: 's', tool: 't', toolClass: 'c', leaseMs: 3000, timeoutMs: 1000, maxDurationMs: 2000, maxAttempts: 1 }];
    const bad = [{ deadline: new Date(), deadlineInMs: 1000 }, { deadlineInMs: -1 }, { deadlineInMs: 2 ** 31 }, { deadlineInMs: 1.5 }];
    for (const d of bad) {
      await expect(r.store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages, ...d })).rejects.toMatchObject({
        code: 'invalid_input',
        details: { path: expect.stringMatching(/^createRun\.deadlineInMs/) },
      });
    }
    await expect(r.submit('dl-orphan', {}, { deadline: 'soon' })).rejects.toMatchObject({ code: 'invalid_input' });
    expect(await count()).toBe(before);
  });

  it('a claim that finds its run past the deadline before any sweep expires the run as the sweep does (reason run_deadline), not as a failure', async () => {
    const { id } = await r.submit('dl-pair', {}, { deadline: '10m' });
    await r.store.clock.advance(11 * 60_000);
    // A key-share lock on the run: the sweepers' expiry (FOR UPDATE SKIP LOCKED) passes it by, the claim does not wait for it.
    const session = new pg.Client({ connectionString: db.url });
    await session.connect();
    try {
      await session.query('BEGIN');
      await session.query('SELECT id FROM ratchet.runs WHERE id = $1 FOR KEY SHARE', [id]);
      await startWorker(['dl_later']);
      await until('the served stage claimed', 10_000, async () => {
        const run = (await r.getRun(id))!;
        return run.stages.find((s) => s.name === 'served')!.attempt >= 1 ? run : null;
      });
      await new Promise((res) => setTimeout(res, 300)); // the executor's expiry waits for the lock (or, before, a finish went by)
      await session.query('COMMIT');
    } finally {
      await session.end();
    }
    const run = await until('the run expired', SWEEP_MS * 2 + 5000, state(id, 'expired'));
    expect(run.error).toMatchObject({ code: 'run_deadline_exceeded' });
    expect(run.stages.map((s) => s.state)).toEqual(['cancelled', 'cancelled']);
    const events = await r.events(id);
    expect(events.filter((e) => e.type === 'run_expired').map((e) => e.data)).toEqual([{ reason: 'run_deadline' }]);
    const cancelled = events.filter((e) => e.type === 'stage_cancelled').map((e) => (e.data as { reason: string }).reason);
    expect(cancelled).toEqual(['run_deadline', 'run_deadline']);
  });

  it('expires a run whose stage waits in a retry delay', async () => {
    await startWorker(['dl_later']);
    const { id } = await r.submit('dl-later', {}, { deadline: '10m' });
    await until('the retry scheduled', 10_000, async () => ((await types(id)).includes('retry_scheduled') ? (await r.getRun(id))! : null));
    await r.store.clock.advance(11 * 60_000); // past the deadline, not the 1 h retry delay
    const run = await until('the run expired', SWEEP_MS * 2 + 3000, state(id, 'expired'));
    expect(run.stages[0]!.state).toBe('cancelled');
    expect(run.stages[0]!.attempt).toBe(1); // never claimed again
    expect(run.error).toMatchObject({ code: 'run_deadline_exceeded' });
    expect(await types(id)).toContain('run_expired');
  });

  it('expires a run whose class no worker serves', async () => {
    await startWorker(['dl_later']); // its sweeper does the work; nobody serves dl_orphan
    const { id } = await r.submit('dl-orphan', {}, { deadline: '10m' });
    await r.store.clock.advance(11 * 60_000);
    const run = await until('the run expired', SWEEP_MS * 2 + 3000, state(id, 'expired'));
    expect(run.stages[0]!.state).toBe('cancelled');
    expect(run.stages[0]!.attempt).toBe(0);
  });

  it("aborts a long stage's attempt with run_deadline and expires its run", async () => {
    const worker = await startWorker(['dl_long']);
    const { id } = await r.submit('dl-long', {}, { deadline: '10m' });
    await until('the stage running', 10_000, async () =>
      (await r.getRun(id))?.stages[0]?.state === 'running' ? (await r.getRun(id))! : null,
    );
    await new Promise((res) => setTimeout(res, 300));
    await r.store.clock.advance(11 * 60_000); // past the deadline; the 1 h lease still holds
    const run = await until('the run expired', SWEEP_MS * 2 + 3000, state(id, 'expired'));
    expect(run.stages[0]!.state).toBe('cancelled');
    const end = Date.now() + 3000; // the next heartbeat tells the attempt
    while (!reasons.includes('run_deadline') && Date.now() < end) await new Promise((res) => setTimeout(res, 25));
    expect(reasons).toEqual(['run_deadline']);
    while (worker.ended.abandoned === 0 && Date.now() < end + 2000) await new Promise((res) => setTimeout(res, 25));
    expect(worker.ended).toMatchObject({ abandoned: 1, rejected: 0 }); // no finish: the stage already ended
    const events = await r.events(id);
    expect(events.map((e) => e.type)).toContain('run_expired');
    expect(events.find((e) => e.type === 'stage_cancelled')?.data).toMatchObject({ previousState: 'running', reason: 'run_deadline' });
  });
});
