import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomUUID } from 'node:crypto';
import { openStore, type Store } from '../../src/store/index.js';
import { stageRows, stageSpecSchema } from '../../src/store/runs.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { spec } from './lease-suite.js';

/**
 * The finish statement's answers to what real operations do to it, on both back ends: a
 * retried finish whose first answer was lost (a replay), a keyed next stage on the fast path,
 * and a next stage whose input could not be computed.
 */
describe.each(['pglite', 'postgres'] as const)('finish on %s', (kind) => {
  let db: TestDatabase | undefined;
  let store: Store;
  let n = 0;
  const cls = () => `f${++n}`;
  beforeAll(async () => {
    if (kind === 'postgres') db = await createTestDatabase('finish');
    store = await openStore(db ? { databaseUrl: db.url } : { dataDir: ':memory:' });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });
  const types = async (runId: string) => (await store.listEvents(runId)).map((e) => e.type);

  it('a replayed finish (its first answer lost) is accepted again, hands back the next stage it claimed, and writes no result_rejected', async () => {
    const c = cls();
    const run = await store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      stages: [spec({ toolClass: c }), spec({ toolClass: c, name: 'two', maxAttempts: 1 })],
    });
    const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
    const row = {
      stageId: a!.id,
      fence: a!.fence,
      outcome: 'succeeded' as const,
      result: { ok: 1 },
      next: { seq: 2, input: { x: 1 } },
      claimNext: true,
    };
    const [first] = await store.finish('A', [row]);
    expect(first).toMatchObject({ accepted: true, replayed: false });
    const next = first!.nextClaimed!;
    expect(next).toMatchObject({ seq: 2, attempt: 1, state: 'running', input: { x: 1 } });
    // The handed stage is the same claim row a claim would return (finish.ts fills in what the statement leaves out).
    const [inDb] = await store.db.query(
      `SELECT s.lease_until, s.claimed_at, s.first_claimed_at, s.owner_id, s.fence::text AS fence, s.state FROM ratchet.stages s WHERE s.id = $1`,
      [next.id],
    );
    expect(next).toMatchObject({ previousState: 'queued', previousFence: null, fence: inDb!.fence, runId: run.id, workflow: 'w' });
    expect(inDb).toMatchObject({ owner_id: 'A', state: 'running' });
    expect(next.leaseUntil.getTime()).toBe((inDb!.lease_until as Date).getTime());
    expect(next.claimedAt.getTime()).toBe((inDb!.claimed_at as Date).getTime());
    expect(next.firstClaimedAt.getTime()).toBe((inDb!.first_claimed_at as Date).getTime());
    expect(next.dbNow.getTime()).toBe(next.claimedAt.getTime());
    expect(next.leaseUntil.getTime() - next.dbNow.getTime()).toBe(next.leaseMs);

    // The same row again, as a worker asks when the first answer never reached it.
    const [again] = await store.finish('A', [row]);
    expect(again).toMatchObject({ accepted: true, replayed: true, currentState: 'succeeded' });
    expect(again!.nextClaimed).toMatchObject({ id: next.id, fence: next.fence, attempt: 1, state: 'running' });

    // Even past the lease, while nobody reclaimed it, the replay renews it: no attempt is spent.
    await store.clock.advance(10_000);
    try {
      const [late] = await store.finish('A', [row]);
      expect(late!.nextClaimed).toMatchObject({ id: next.id, fence: next.fence, attempt: 1 });
      expect(late!.nextClaimed!.leaseUntil.getTime()).toBeGreaterThan(late!.nextClaimed!.dbNow.getTime());
      const [renewed] = await store.db.query(`SELECT lease_until FROM ratchet.stages WHERE id = $1`, [next.id]);
      expect(late!.nextClaimed!.leaseUntil.getTime()).toBe((renewed!.lease_until as Date).getTime());
      const [b] = await store.finish('A', [
        { stageId: next.id, fence: next.fence, outcome: 'succeeded', result: {}, run: { state: 'succeeded' } },
      ]);
      expect(b!.accepted).toBe(true);
    } finally {
      await store.clock.setOffset(0);
    }
    expect((await store.getRun(run.id))!.state).toBe('succeeded');
    const ev = await types(run.id);
    expect(ev).not.toContain('result_rejected');
    expect(ev.filter((t) => t === 'finish_replayed')).toHaveLength(2);
    expect(ev.filter((t) => t === 'stage_succeeded')).toHaveLength(2);
  });

  it('a replay never hands back a next stage someone else reclaimed, and another owner or token is still rejected', async () => {
    const c = cls();
    const run = await store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      stages: [spec({ toolClass: c }), spec({ toolClass: c, name: 'two' })],
    });
    const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
    const row = {
      stageId: a!.id,
      fence: a!.fence,
      outcome: 'succeeded' as const,
      result: {},
      next: { seq: 2, input: {} },
      claimNext: true,
    };
    const [first] = await store.finish('A', [row]);
    await store.clock.advance(10_000);
    try {
      const [taken] = await store.claim({ owner: 'B', toolClass: c, limit: 1 });
      expect(taken).toMatchObject({ id: first!.nextClaimed!.id, previousState: 'running' });
      const [again] = await store.finish('A', [row]);
      expect(again).toMatchObject({ accepted: true, replayed: true, nextClaimed: null });
    } finally {
      await store.clock.setOffset(0);
    }
    const [other] = await store.finish('B', [row]);
    expect(other!.accepted).toBe(false);
    expect((await types(run.id)).filter((t) => t === 'result_rejected')).toHaveLength(1);
  });

  it('a replayed retry (outcome queued) is accepted, not rejected; a reclaim-exhausted stage is never taken for a replayed failure', async () => {
    const c = cls();
    const run = await store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: c, maxAttempts: 1 })] });
    const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
    const retry = { stageId: a!.id, fence: a!.fence, outcome: 'queued' as const, retryDelayMs: 0, error: { code: 'x', message: 'x' } };
    expect((await store.finish('A', [retry]))[0]).toMatchObject({ accepted: true, replayed: false });
    expect((await store.finish('A', [retry]))[0]).toMatchObject({ accepted: true, replayed: true });
    expect(await types(run.id)).not.toContain('result_rejected');

    // Now the budget: a claim finds it spent and fails the stage with this same token; a failure
    // finish of that token was never written, so it is rejected, not replayed.
    const [b] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
    expect(b!.state).toBe('failed');
    const [v] = await store.finish('A', [
      { stageId: a!.id, fence: a!.fence, outcome: 'failed', error: { code: 'y', message: 'y' }, run: { state: 'failed' } },
    ]);
    expect(v).toMatchObject({ accepted: false, replayed: false });
  });

  it('the fast path never leaves a keyed next stage pending: it is queued for the limited claim instead', async () => {
    const c = cls();
    const keyed = { concurrencyKey: `k-${c}`, concurrencyLimit: 1 };
    const run = await store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      stages: [spec({ toolClass: c, ...keyed }), spec({ toolClass: c, name: 'two', ...keyed })],
    });
    const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1, limits: { keyed: true } });
    const [v] = await store.finish('A', [
      { stageId: a!.id, fence: a!.fence, outcome: 'succeeded', result: {}, next: { seq: 2, input: { k: 2 } }, claimNext: true },
    ]);
    expect(v).toMatchObject({ accepted: true, nextClaimed: null, nextToolClass: c });
    const stages = (await store.getRun(run.id))!.stages;
    expect(stages.map((s) => s.state)).toEqual(['succeeded', 'queued']);
    expect(v!.nextStageId).toBe(stages[1]!.id);
    const [b] = await store.claim({ owner: 'A', toolClass: c, limit: 1, limits: { keyed: true } });
    expect(b).toMatchObject({ seq: 2, input: { k: 2 } });
  });

  it('the fast path yields to a due stage of higher priority of its class and definition; equal, lower or not yet due ones do not stop it', async () => {
    const c = cls();
    const two = (priority: number) =>
      store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: {},
        priority,
        stages: [spec({ toolClass: c }), spec({ toolClass: c, name: 'two' })],
      });
    const finishFirst = async (runId: string, meanwhile?: () => Promise<unknown>) => {
      const first = (await store.getRun(runId))!.stages[0]!;
      await store.db.query(`UPDATE ratchet.stages SET available_at = ratchet.db_now() - interval '1 hour' WHERE id = $1`, [first.id]);
      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
      expect(a!.id).toBe(first.id);
      await meanwhile?.();
      const [v] = await store.finish('A', [
        { stageId: a!.id, fence: a!.fence, outcome: 'succeeded', result: {}, next: { seq: 2, input: {} }, claimNext: true },
      ]);
      return v!;
    };
    // Others of the class wait: one of equal priority, one lower, one higher but due only in an hour.
    const equal = await two(5);
    const lower = await two(1);
    const later = await two(9);
    await store.db.query(`UPDATE ratchet.stages SET available_at = ratchet.db_now() + interval '1 hour' WHERE run_id = $1 AND seq = 1`, [
      later.id,
    ]);
    const run = await two(5);
    const claimed = await finishFirst(run.id);
    expect(claimed.nextClaimed).toMatchObject({ seq: 2, state: 'running', runId: run.id });
    // Now a due stage of higher priority waits: the next stage is queued for the claim, not taken.
    const run2 = await two(5);
    const yielded = await finishFirst(run2.id, () => two(7));
    expect(yielded).toMatchObject({ accepted: true, nextClaimed: null, nextToolClass: c });
    expect((await store.getRun(run2.id))!.stages.map((s) => s.state)).toEqual(['succeeded', 'queued']);
    expect([equal, lower, later].every((r) => r.id)).toBe(true);
  });

  it('a next stage whose input could not be computed fails with the run, and a retry of the run starts there', async () => {
    const c = cls();
    const run = await store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      stages: [spec({ toolClass: c }), spec({ toolClass: c, name: 'two' }), spec({ toolClass: c, name: 'three' })],
    });
    const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
    const error = { code: 'step_input_failed', message: 'computing the input of step 2 failed: boom' };
    const [v] = await store.finish('A', [
      {
        stageId: a!.id,
        fence: a!.fence,
        outcome: 'succeeded',
        result: { one: 1 },
        next: { seq: 2, input: null, error },
        run: { state: 'failed', error },
      },
    ]);
    expect(v).toMatchObject({ accepted: true, nextClaimed: null, nextStageId: null });
    let r = (await store.getRun(run.id))!;
    expect(r.state).toBe('failed');
    expect(r.stages.map((s) => s.state)).toEqual(['succeeded', 'failed', 'cancelled']);
    expect(r.stages[1]!.error).toMatchObject({ code: 'step_input_failed' });
    expect(await types(run.id)).toEqual(['run_submitted', 'job_claimed', 'stage_succeeded', 'stage_failed', 'run_failed']);

    expect(await store.retryRun(run.id)).toMatchObject({ retried: true, stage: { seq: 2 } });
    r = (await store.getRun(run.id))!;
    expect(r.stages.map((s) => s.state)).toEqual(['succeeded', 'queued', 'pending']);
    expect(r.stages[1]!.input).toBeNull(); // computed by the attempt that runs it
  });

  it('the effect key is stored by the finish and by the tool_request_started event of the attempt', async () => {
    const c = cls();
    const run = await store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: c })] });
    const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
    await store.appendEvents([
      {
        runId: run.id,
        stageId: a!.id,
        type: 'tool_request_started',
        fence: a!.fence,
        attempt: 1,
        data: { requestId: 'r1', effectKey: 'order:7' },
      },
    ]);
    expect((await store.getRun(run.id))!.stages[0]!.effectKey).toBe('order:7');
    // A stale token's event never writes the stage's key.
    await store.appendEvents([
      {
        runId: run.id,
        stageId: a!.id,
        type: 'tool_request_started',
        fence: '0',
        attempt: 1,
        data: { requestId: 'r0', effectKey: 'stale' },
      },
    ]);
    expect((await store.getRun(run.id))!.stages[0]!.effectKey).toBe('order:7');
    await store.finish('A', [
      { stageId: a!.id, fence: a!.fence, outcome: 'succeeded', result: {}, effectKey: 'order:8', run: { state: 'succeeded' } },
    ]);
    expect((await store.getRun(run.id))!.stages[0]!.effectKey).toBe('order:8');
  });
  it("a child run is keyed by its stage alone: a user's run under the key child:<stage id> neither blocks it nor is taken for it", async () => {
    const c = cls();
    const run = await store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      sinksLeft: 1,
      stages: [{ ...spec({ toolClass: c, name: 'sub' }), deps: [], nextSeqs: [], sink: 'only' }],
    });
    const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
    // A user's own run, submitted with the key the child insert used to take.
    const user = await store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      idempotencyKey: `child:${a!.id}`,
      stages: [spec({ toolClass: `${c}_user` })],
    });
    const child = {
      id: randomUUID(),
      workflow: 'w',
      definitionHash: 'h',
      input: { n: 1 },
      sinksLeft: null,
      stages: stageRows([stageSpecSchema.parse(spec({ toolClass: `${c}_kid` }))], {}, 'child').map(
        (r) => JSON.parse(JSON.stringify(r)) as Record<string, unknown>,
      ),
    };
    const [v] = await store.finish('A', [{ stageId: a!.id, fence: a!.fence, outcome: 'waiting', waitFor: 1, child }]);
    expect(v!.accepted).toBe(true);
    const kid = await store.getRun(child.id);
    expect(kid).toMatchObject({ parentRunId: run.id, parentStageId: a!.id, idempotencyKey: null, state: 'queued' });
    expect(kid!.stages).toHaveLength(1);
    expect((await store.getRun(run.id))!.stages[0]!.state).toBe('waiting');
    expect((await store.getRun(user.id))!.parentRunId ?? null).toBeNull();
    expect(await types(run.id)).toContain('child_run_started');
  });
  it('expiry: a child expired alone wakes its parent stage; with its parent it is not woken; an expired run cancels its children recursively', async () => {
    const c = cls();
    const kidOf = (toolClass: string, deadlineMs: number | null) => ({
      id: randomUUID(),
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      sinksLeft: null,
      deadlineMs,
      stages: stageRows([stageSpecSchema.parse(spec({ toolClass, leaseMs: 600_000 }))], {}, 'child').map(
        (r) => JSON.parse(JSON.stringify(r)) as Record<string, unknown>,
      ),
    });
    const start = async (toolClass: string, kid: ReturnType<typeof kidOf>) => {
      const [a] = await store.claim({ owner: 'A', toolClass, limit: 1 });
      const [v] = await store.finish('A', [{ stageId: a!.id, fence: a!.fence, outcome: 'waiting', waitFor: 1, child: kid }]);
      expect(v!.accepted).toBe(true);
      return a!;
    };
    const parent = (toolClass: string, deadlineInMs?: number) =>
      store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: {},
        sinksLeft: 1,
        ...(deadlineInMs === undefined ? {} : { deadlineInMs }),
        stages: [{ ...spec({ toolClass, name: 'sub' }), deps: [], nextSeqs: [], sink: 'only' }],
      });
    // 1: no deadline, its child has its own; 2: both expire; 3: the parent expires, its child and grandchild have none.
    const p1 = await parent(`${c}_1`);
    const k1 = kidOf(`${c}_k1`, 1000);
    const s1 = await start(`${c}_1`, k1);
    const p2 = await parent(`${c}_2`, 1000);
    const k2 = kidOf(`${c}_k2`, 1000);
    const s2 = await start(`${c}_2`, k2);
    const p3 = await parent(`${c}_3`, 1000);
    const k3 = kidOf(`${c}_k3`, null);
    await start(`${c}_3`, k3);
    const g3 = kidOf(`${c}_g3`, null);
    await start(`${c}_k3`, g3);
    const [g] = await store.claim({ owner: 'A', toolClass: `${c}_g3`, limit: 1 });
    expect((await store.getRun(k1.id))!.deadline).not.toBeNull();
    expect((await store.getRun(k3.id))!.deadline).toBeNull();

    await store.clock.advance(1001);
    const out = await store.expireRuns(100);
    expect(out.woken).toEqual([{ stageId: s1.id, toolClass: `${c}_1`, definitionHash: 'h', attempt: 2 }]);
    expect(out.runningStageIds).toContain(g!.id);
    const state = async (id: string) => (await store.getRun(id))!;
    expect((await state(p1.id)).state).toBe('running');
    expect((await state(p1.id)).stages[0]!.state).toBe('queued');
    expect((await state(k1.id)).state).toBe('expired');
    expect((await state(p2.id)).state).toBe('expired');
    expect((await state(p2.id)).stages[0]!.id).toBe(s2.id);
    expect((await state(p2.id)).stages[0]!.state).toBe('cancelled');
    expect((await state(k2.id)).state).toBe('expired');
    expect((await state(p3.id)).state).toBe('expired');
    for (const id of [k3.id, g3.id]) {
      const d = await state(id);
      expect(d.state).toBe('cancelled');
      expect(d.stages.map((x) => x.state)).toEqual(['cancelled']);
      expect((await store.listEvents(id)).filter((e) => e.type === 'run_cancelled').map((e) => e.data)).toEqual([
        { reason: 'parent_expired' },
      ]);
    }
    const [ext] = await store.extend({ owner: 'A', leases: [{ stageId: g!.id, fence: g!.fence }] });
    expect(ext!.verdict).toBe('cancelled');
  });
});
