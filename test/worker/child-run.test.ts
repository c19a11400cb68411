import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createServer, type ApiServer } from '../../src/api/server.js';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { PermanentError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { abortCode } from '../helpers/abort.js';

/**
 * Child runs (issue 11) on PostgreSQL: a step `{ workflow: 'other' }` starts one child run keyed
 * by its stage, waits for it without a lease (state `waiting`), and takes its result; a failed
 * child fails the step with child_run_failed; cancelling the parent cancels the child (its
 * running tool's signal aborts with `cancelled`); GET /v1/runs/:id shows parentRunId and children.
 */
const c = defineToolClass({
  name: 'child_io',
  lease: '3s',
  heartbeat: '500ms',
  jitter: '100ms',
  timeout: '20s',
  maxDuration: '30s',
  retry: { maxAttempts: 1 },
});
const any = z.object({}).passthrough();
const calls: Record<string, unknown[]> = {};
const tool = (name: string, run: (input: Record<string, unknown>, signal: AbortSignal) => unknown | Promise<unknown>) =>
  defineTool({
    name,
    description: name,
    class: c,
    input: any,
    output: z.unknown(),
    run: async (input, ctx) => {
      (calls[name] ??= []).push(input);
      return run(input, ctx.signal);
    },
  });
const double = tool('double', (i) => ({ n: (i.n as number) * 2 }));
const child = defineWorkflow({ name: 'child_double', input: z.object({ n: z.number() }), steps: [{ tool: double }] });
const prep = tool('prep', () => ({ n: 21 }));
const finish = tool('finish', (i) => ({ final: i }));
const parent = defineWorkflow({
  name: 'parent',
  input: any,
  steps: [
    { tool: prep },
    { name: 'sub', workflow: 'child_double', input: ({ results }) => results.prep },
    { tool: finish, input: ({ results }) => results.sub },
  ],
});
const refuse = tool('refuse', () => {
  throw new PermanentError('the child says no', { code: 'child_no' });
});
const badChild = defineWorkflow({ name: 'child_bad', input: any, steps: [{ tool: refuse }] });
const badParent = defineWorkflow({ name: 'parent_bad', input: any, steps: [{ name: 'sub', workflow: 'child_bad' }] });
const hold = tool('hold', async (_i, signal) => {
  const reason = await abortCode(signal);
  (calls.hold_reason ??= []).push(reason);
  throw signal.reason;
});
const slowChild = defineWorkflow({ name: 'child_slow', input: any, steps: [{ tool: hold }] });
const slowParent = defineWorkflow({ name: 'parent_slow', input: any, steps: [{ name: 'sub', workflow: 'child_slow' }] });
/** Waits for its abort and records the reason under `hold_reason_<key>`. */
const holdFor = (key: string) =>
  tool(`hold_${key}`, async (_i, signal) => {
    const reason = await abortCode(signal);
    (calls[`hold_reason_${key}`] ??= []).push(reason);
    throw signal.reason;
  });
// A child with its own deadline under a parent without one; a child without one under a parent submitted with one.
// Real-time deadlines: 3 s leaves room for the parent's claim, the child's insert and claim on a loaded machine.
const expiringChild = defineWorkflow({ name: 'child_expiring', input: any, deadline: '3s', steps: [{ tool: holdFor('kid') }] });
const patientParent = defineWorkflow({ name: 'parent_patient', input: any, steps: [{ name: 'sub', workflow: 'child_expiring' }] });
const patientChild = defineWorkflow({ name: 'child_patient', input: any, steps: [{ tool: holdFor('patient') }] });
const expiringParent = defineWorkflow({ name: 'parent_expiring', input: any, steps: [{ name: 'sub', workflow: 'child_patient' }] });

// Retry of a parent after its child failed: the child's first step succeeds once (an effect), its second fails the
// first time only; a sibling branch of another parent fails while its child waits (the child is cancelled).
const effects: Record<string, number> = {};
let flakyFailures = 1;
const effect = tool('effect', () => ({ ok: true }));
const flaky = defineTool({
  name: 'flaky_once',
  description: 'fails for good the first time',
  class: c,
  input: any,
  output: z.unknown(),
  run: async (_i, ctx) => {
    if (flakyFailures-- > 0) throw new PermanentError('not yet', { code: 'not_yet' });
    effects[ctx.idempotencyKey] = (effects[ctx.idempotencyKey] ?? 0) + 1;
    return { second: 'time' };
  },
});
const effectOnce = defineTool({
  name: 'effect_once',
  description: 'counts its effect per key',
  class: c,
  input: any,
  output: z.unknown(),
  run: async (_i, ctx) => {
    effects[ctx.idempotencyKey] = (effects[ctx.idempotencyKey] ?? 0) + 1;
    return { done: true };
  },
});
const retryChild = defineWorkflow({ name: 'child_retry', input: any, steps: [{ tool: effectOnce }, { tool: flaky }] });
const retryParent = defineWorkflow({
  name: 'parent_retry',
  input: any,
  steps: [{ name: 'sub', workflow: 'child_retry' }, { tool: effect }],
});
let siblingFailures = 1;
const gate = { open: false, childRunning: false };
const sibling = tool('sibling_once', async () => {
  // The sibling fails only once the child's tool runs: the test is about a child cancelled mid-run (without the wait,
  // `side` could fail before `sub` started its child, and there would be no child to detach).
  for (let i = 0; i < 400 && !gate.childRunning; i++) await new Promise((res) => setTimeout(res, 25));
  if (siblingFailures-- > 0) throw new PermanentError('sibling down', { code: 'sibling_down' });
  return { sibling: true };
});
const waitGate = tool('wait_gate', async () => {
  gate.childRunning = true;
  for (let i = 0; i < 400 && !gate.open; i++) await new Promise((res) => setTimeout(res, 25));
  return { gated: true };
});
const gatedChild = defineWorkflow({ name: 'child_gated', input: any, steps: [{ tool: waitGate }] });
const forkParent = defineWorkflow({
  name: 'parent_fork',
  input: any,
  steps: [
    { name: 'sub', workflow: 'child_gated' },
    { name: 'side', tool: sibling, after: [] },
    { name: 'end', tool: effect, after: ['sub', 'side'] },
  ],
});

const TOKEN = 't0123456789abcdef';
const auth = { headers: { authorization: `Bearer ${TOKEN}` } };

describe('child runs (PostgreSQL)', () => {
  let db: TestDatabase;
  let r: Ratchet;
  let api: ApiServer;
  beforeAll(async () => {
    db = await createTestDatabase('child_run');
    r = await createRatchet({
      databaseUrl: db.url,
      workflows: [
        child,
        parent,
        badChild,
        badParent,
        slowChild,
        slowParent,
        expiringChild,
        patientParent,
        patientChild,
        expiringParent,
        retryChild,
        retryParent,
        gatedChild,
        forkParent,
      ],
      logger: silentLogger(),
    });
    await r.worker({ pollIntervalMs: 50, concurrency: 4, sweepIntervalMs: 200 }).start();
    api = await createServer({ ratchet: r, tokens: [TOKEN], port: 0 });
  });
  afterAll(async () => {
    await api?.close();
    await r?.close();
    await db?.drop();
  });
  const ended = async (id: string) => {
    for (let i = 0; i < 400; i++) {
      const run = (await r.store.getRun(id))!;
      if (['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state)) return run;
      await new Promise((res) => setTimeout(res, 25));
    }
    throw new Error('run did not end');
  };

  it('starts one child keyed by its stage, waits without a lease, and takes its result; the API shows parent and children', async () => {
    const { id } = await r.submit('parent', {});
    const run = await ended(id);
    expect(run.state).toBe('succeeded');
    expect(run.result).toEqual({ final: { n: 42 } });
    expect(run.children).toHaveLength(1);
    const kid = (await r.store.getRun(run.children![0]!.id))!;
    expect(kid).toMatchObject({ workflow: 'child_double', state: 'succeeded', parentRunId: id, result: { n: 42 } });
    expect(kid.parentStageId).toBe(run.stages[1]!.id);
    const types = (await r.events(id)).map((e) => e.type);
    expect(types.filter((t) => t === 'child_run_started')).toHaveLength(1);
    expect(types.filter((t) => t === 'stage_waiting')).toHaveLength(1);
    const body = (await (await fetch(`${api.url}/v1/runs/${id}`, auth)).json()) as Record<string, unknown>;
    expect(body).toMatchObject({ parentRunId: null, children: [{ id: kid.id, workflow: 'child_double', state: 'succeeded' }] });
    const kidBody = (await (await fetch(`${api.url}/v1/runs/${kid.id}`, auth)).json()) as Record<string, unknown>;
    expect(kidBody).toMatchObject({ parentRunId: id, children: [] });
  });

  it('a failed child fails the parent stage with child_run_failed (its error in details)', async () => {
    const run = await ended((await r.submit('parent_bad', {})).id);
    expect(run.state).toBe('failed');
    expect(run.error).toMatchObject({ code: 'child_run_failed', details: { childError: { code: 'child_no' } } });
  });

  it('retry of a parent whose child failed retries the child in place: the run succeeds, each effect once per key', async () => {
    const { id } = await r.submit('parent_retry', {});
    let run = await ended(id);
    expect(run.state).toBe('failed');
    expect(run.error).toMatchObject({ code: 'child_run_failed' });
    const kidId = run.children![0]!.id;
    const res = await r.retry(id);
    expect(res).toMatchObject({ retried: true, childQueued: [{ toolClass: 'child_io' }] });
    run = await ended(id);
    expect(run.state).toBe('succeeded');
    expect(run.children!.map((k) => k.id)).toEqual([kidId]); // the same child, retried: no second one
    const kid = (await r.store.getRun(kidId))!;
    expect(kid.state).toBe('succeeded');
    expect(kid.stages.map((s) => s.state)).toEqual(['succeeded', 'succeeded']);
    expect(Object.values(effects).every((n) => n === 1)).toBe(true);
    expect(Object.keys(effects).filter((k) => k.startsWith(kidId))).toHaveLength(2);
  });

  it('retry after a sibling failed while the child ran: the cancelled child is detached and a new one started', async () => {
    const { id } = await r.submit('parent_fork', {});
    let run = await ended(id);
    expect(run.state).toBe('failed');
    expect(run.error).toMatchObject({ code: 'sibling_down' });
    const old = (await r.store.getRun(run.children![0]!.id))!;
    expect(old.state).toBe('cancelled');
    gate.open = true;
    expect(await r.retry(id)).toMatchObject({ retried: true });
    run = await ended(id);
    expect(run.state).toBe('succeeded');
    expect(run.children).toHaveLength(2);
    const fresh = run.children!.find((k) => k.id !== old.id)!;
    expect(fresh.state).toBe('succeeded');
    expect((await r.store.getRun(old.id))!.parentStageId).toBeNull();
  });

  it('cancelling the parent cancels its child: the child tool signal aborts with cancelled', async () => {
    const { id } = await r.submit('parent_slow', {});
    for (let i = 0; i < 400 && !calls.hold; i++) await new Promise((res) => setTimeout(res, 25));
    expect(calls.hold).toHaveLength(1);
    // explain says the parent waits for its child, with the child's own verdict.
    const ex = await r.explain(id);
    expect(ex.verdict).toBe('waiting_for_child');
    expect(ex.evidence).toMatchObject({
      workflow: 'child_slow',
      childVerdict: (await r.explain((ex.evidence as { childRunId: string }).childRunId)).verdict,
    });
    await r.cancel(id);
    for (let i = 0; i < 400 && !calls.hold_reason; i++) await new Promise((res) => setTimeout(res, 25));
    expect(calls.hold_reason).toEqual(['cancelled']);
    const run = (await r.store.getRun(id))!;
    expect(run.state).toBe('cancelled');
    expect(run.stages.map((s) => s.state)).toEqual(['cancelled']);
    const kid = (await r.store.getRun(run.children![0]!.id))!;
    expect(kid.state).toBe('cancelled');
    expect(kid.stages.map((s) => s.state)).toEqual(['cancelled']);
  });
  it('a child run expired by its own deadline wakes its parent, whose stage fails with child_run_expired', async () => {
    const { id } = await r.submit('parent_patient', {});
    const run = await ended(id);
    expect(run.state).toBe('failed');
    expect(run.error).toMatchObject({ code: 'child_run_expired' });
    expect(run.deadline).toBeNull();
    const kid = (await r.store.getRun(run.children![0]!.id))!;
    expect(kid.state).toBe('expired');
    expect(kid.deadline).not.toBeNull(); // its own workflow's deadline, not its parent's (none)
    for (let i = 0; i < 400 && !calls.hold_reason_kid; i++) await new Promise((res) => setTimeout(res, 25));
    expect(calls.hold_reason_kid).toEqual(['run_deadline']);
  });

  it("a parent run's expiry cancels its child run (recursively), whose running tool's signal aborts with cancelled", async () => {
    const { id } = await r.submit('parent_expiring', {}, { deadline: '3s' });
    const run = await ended(id);
    expect(run.state).toBe('expired');
    // The sweeper cancels the children in the transaction that expires the parent (src/store/deadline.ts): no read
    // sees the parent expired and the child still running.
    const kid = (await r.store.getRun(run.children![0]!.id))!;
    expect(kid.state).toBe('cancelled');
    expect(kid.deadline).toBeNull();
    expect(kid.stages.map((s) => s.state)).toEqual(['cancelled']);
    const kidEvents = await r.events(kid.id);
    expect(kidEvents.find((e) => e.type === 'run_cancelled')?.data).toEqual({ reason: 'parent_expired' });
    for (let i = 0; i < 400 && !calls.hold_reason_patient; i++) await new Promise((res) => setTimeout(res, 25));
    expect(calls.hold_reason_patient).toEqual(['cancelled']);
  });
});
