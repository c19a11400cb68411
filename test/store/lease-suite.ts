import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IllegalTransitionError, InvalidInputError, UnknownStageError } from '../../src/errors.js';
import { IdempotencyConflictError, type Store } from '../../src/store/index.js';
import { randomUUID } from 'node:crypto';
import { type StageSpec, stageRows, stageSpecSchema } from '../../src/store/runs.js';

export const spec = (over: Partial<StageSpec> = {}): StageSpec => ({
  name: 'step',
  tool: 'noop',
  toolClass: 'io',
  leaseMs: 3000,
  timeoutMs: 2000,
  maxDurationMs: 60_000,
  maxAttempts: 3,
  ...over,
});

/** The lease protocol, the same tests on every back end (PostgreSQL and PGlite). */
export function leaseConformance(backend: string, open: () => Promise<{ store: Store; cleanup: () => Promise<void> }>) {
  describe(`lease protocol on ${backend}`, () => {
    let store: Store;
    let cleanup: () => Promise<void>;
    let n = 0;
    // Each test uses its own tool class, so claims never see another test's stages.
    const cls = () => `c${++n}`;

    beforeAll(async () => {
      ({ store, cleanup } = await open());
    });
    afterAll(async () => {
      await cleanup();
    });

    const counts = async () => {
      const [r] = await store.db.query(`SELECT (SELECT count(*) FROM ratchet.runs)::int AS runs,
        (SELECT count(*) FROM ratchet.stages)::int AS stages, (SELECT count(*) FROM ratchet.events)::int AS events`);
      return r;
    };
    const events = async (runId: string) => (await store.listEvents(runId)).map((e) => e);

    it('claims with a new fence, attempt 1, a lease from the stage, and the database now', async () => {
      const c = cls();
      const run = await store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: { a: 1 },
        stages: [spec({ toolClass: c }), spec({ toolClass: c, name: 'two' })],
      });
      const [s] = await store.claim({ owner: 'A', toolClass: c, limit: 10 });
      expect(s).toBeDefined();
      expect(s!.state).toBe('running');
      expect(s!.attempt).toBe(1);
      expect(s!.seq).toBe(1); // only the first stage is queued; the second is pending
      expect(s!.input).toEqual({ a: 1 });
      expect(s!.leaseUntil.getTime() - s!.dbNow.getTime()).toBe(3000);
      expect(s!.confirmedUntil).toBeLessThan(performance.now() + 3000);
      expect((await store.getRun(run.id))!.state).toBe('running');
      expect((await events(run.id)).map((e) => e.type)).toEqual(['run_submitted', 'job_claimed']);
      expect(await store.claim({ owner: 'B', toolClass: c, limit: 10 })).toEqual([]);
    });

    it('reclaims an expired lease with a strictly greater fence; the old owner can neither extend nor finish', async () => {
      const c = cls();
      const run = await store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: c })] });
      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
      await store.clock.advance(3001);
      const [b] = await store.claim({ owner: 'B', toolClass: c, limit: 1 });
      expect(b!.id).toBe(a!.id);
      expect(BigInt(b!.fence)).toBeGreaterThan(BigInt(a!.fence));
      expect(b!.attempt).toBe(2);
      expect(b!.previousState).toBe('running');
      expect(b!.previousFence).toBe(a!.fence);

      const [ext] = await store.extend({ owner: 'A', leases: [{ stageId: a!.id, fence: a!.fence }] });
      expect(ext!.verdict).toBe('lost');
      const [late] = await store.finish('A', [
        {
          stageId: a!.id,
          fence: a!.fence,
          outcome: 'succeeded',
          result: { by: 'A' },
          run: { state: 'succeeded', result: { by: 'A' } },
          data: { resultHash: 'h-a' },
        },
      ]);
      expect(late!.accepted).toBe(false);
      const [ok] = await store.finish('B', [
        { stageId: b!.id, fence: b!.fence, outcome: 'succeeded', result: { by: 'B' }, run: { state: 'succeeded', result: { by: 'B' } } },
      ]);
      expect(ok!.accepted).toBe(true);

      const after = (await store.getRun(run.id))!;
      expect(after.state).toBe('succeeded');
      expect(after.result).toEqual({ by: 'B' });
      expect(after.stages[0]!.result).toEqual({ by: 'B' });
      expect(after.stages[0]!.fence).toBe(b!.fence);
      const ev = await events(run.id);
      const rejected = ev.filter((e) => e.type === 'result_rejected');
      expect(rejected).toHaveLength(1);
      expect(rejected[0]!.fence).toBe(a!.fence);
      expect(rejected[0]!.data).toMatchObject({ reason: 'stale_fence', owner: 'A', resultHash: 'h-a', currentFence: b!.fence });
      expect(JSON.stringify(rejected[0]!.data)).not.toContain('"by"'); // hash, not payload
      expect(ev.some((e) => e.type === 'heartbeat_lost' && e.fence === a!.fence)).toBe(true);
      expect(ev.filter((e) => e.type === 'run_succeeded')).toHaveLength(1);
    });

    it('an extend after lease_until fails even when nobody has reclaimed, and so does a finish', async () => {
      const c = cls();
      const run = await store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: c })] });
      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
      const [first] = await store.extend({ owner: 'A', leases: [{ stageId: a!.id, fence: a!.fence }] });
      expect(first!.verdict).toBe('extended');
      expect(first!.confirmedUntil).not.toBeNull();
      await store.clock.advance(3001);
      const [ext] = await store.extend({ owner: 'A', leases: [{ stageId: a!.id, fence: a!.fence }] });
      expect(ext!.verdict).toBe('lost');
      expect(ext!.confirmedUntil).toBeNull();
      const [fin] = await store.finish('A', [{ stageId: a!.id, fence: a!.fence, outcome: 'succeeded', result: 1 }]);
      expect(fin!.accepted).toBe(false);
      const rej = (await events(run.id)).find((e) => e.type === 'result_rejected');
      expect(rej!.data).toMatchObject({ reason: 'lease_expired' });
      // Still `running` and reclaimable: state and ownership are different things.
      expect((await store.getRun(run.id))!.stages[0]!.state).toBe('running');
      const [b] = await store.claim({ owner: 'B', toolClass: c, limit: 1 });
      expect(b!.previousState).toBe('running');
    });

    it('extends a batch in one call and tells each lease apart', async () => {
      const c = cls();
      for (let i = 0; i < 3; i++)
        await store.createRun({ workflow: 'w', definitionHash: 'h', input: { i }, stages: [spec({ toolClass: c })] });
      const claimed = await store.claim({ owner: 'A', toolClass: c, limit: 3 });
      expect(claimed).toHaveLength(3);
      const res = await store.extend({
        owner: 'A',
        leases: [
          ...claimed.map((s) => ({ stageId: s.id, fence: s.fence })),
          { stageId: claimed[0]!.id, fence: '999999999' },
          { stageId: '987654321', fence: '1' },
        ],
      });
      expect(res.map((r) => r.verdict).sort()).toEqual(['extended', 'extended', 'extended', 'lost', 'lost']);
    });

    it('an extend past maxDuration ends the attempt (stage_duration_exceeded) and counts it', async () => {
      const c = cls();
      const run = await store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: {},
        // A 60 s lease: only the advanced clock and maxDuration decide, never the real time between two extends.
        stages: [spec({ toolClass: c, leaseMs: 60_000, maxDurationMs: 5000, maxAttempts: 2 }), spec({ toolClass: c, name: 'next' })],
      });
      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
      for (let i = 0; i < 3; i++) {
        await store.clock.advance(2000);
        const [ext] = await store.extend({ owner: 'A', leases: [{ stageId: a!.id, fence: a!.fence }] });
        expect(ext!.verdict).toBe(i < 2 ? 'extended' : 'duration_exceeded');
      }
      let r = (await store.getRun(run.id))!;
      expect(r.stages[0]!.state).toBe('queued');
      expect(r.stages[0]!.error).toMatchObject({ code: 'stage_duration_exceeded' });
      const [fin] = await store.finish('A', [{ stageId: a!.id, fence: a!.fence, outcome: 'succeeded', result: 1 }]);
      expect(fin!.accepted).toBe(false);

      const [b] = await store.claim({ owner: 'B', toolClass: c, limit: 1 });
      expect(b!.attempt).toBe(2);
      await store.clock.advance(2500);
      await store.extend({ owner: 'B', leases: [{ stageId: b!.id, fence: b!.fence }] });
      await store.clock.advance(2600);
      const [ext] = await store.extend({ owner: 'B', leases: [{ stageId: b!.id, fence: b!.fence }] });
      expect(ext!.verdict).toBe('duration_exceeded');
      r = (await store.getRun(run.id))!;
      expect(r.stages[0]!.state).toBe('failed'); // the budget was spent by this attempt
      expect(r.state).toBe('failed');
      expect(r.error).toMatchObject({ code: 'stage_duration_exceeded' });
      expect(r.stages[1]!.state).toBe('cancelled');
      expect((await events(run.id)).filter((e) => e.type === 'stage_duration_exceeded')).toHaveLength(2);
    });

    it('an extend past maxDuration follows the retry policy the lease carries: its delay, or no further attempt', async () => {
      const c = cls();
      const run = await store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: {},
        stages: [spec({ toolClass: c, maxDurationMs: 1000, maxAttempts: 3 })],
      });
      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
      await store.clock.advance(1500);
      const [ext] = await store.extend({ owner: 'A', leases: [{ stageId: a!.id, fence: a!.fence, retryDelayMs: 3000 }] });
      expect(ext!.verdict).toBe('duration_exceeded');
      const over = (await events(run.id)).find((e) => e.type === 'stage_duration_exceeded')!;
      expect(over.data).toMatchObject({ nextState: 'queued', delayMs: 3000 });
      expect(await store.claim({ owner: 'B', toolClass: c, limit: 1 })).toEqual([]); // not due yet
      await store.clock.advance(3000);
      const [b] = await store.claim({ owner: 'B', toolClass: c, limit: 1 });
      expect(b!.attempt).toBe(2);

      // The policy allows no further attempt (maxElapsed spent), though maxAttempts would: the run fails.
      await store.clock.advance(1500);
      const [ext2] = await store.extend({ owner: 'B', leases: [{ stageId: b!.id, fence: b!.fence, retryDelayMs: null }] });
      expect(ext2!.verdict).toBe('duration_exceeded');
      const r = (await store.getRun(run.id))!;
      expect(r.stages[0]!.state).toBe('failed');
      expect(r.state).toBe('failed');
      expect(r.error).toMatchObject({ code: 'stage_duration_exceeded', decision: 'max_elapsed' });
      const last = (await events(run.id)).filter((e) => e.type === 'stage_duration_exceeded').at(-1)!;
      expect(last.data).toMatchObject({ nextState: 'failed', decision: 'max_elapsed' });

      await expect(store.extend({ owner: 'B', leases: [{ stageId: b!.id, fence: b!.fence, retryDelayMs: -5 }] })).rejects.toMatchObject({
        code: 'invalid_input',
      });
    });

    it('a reclaim that finds the attempt budget spent fails the stage with attempts_exhausted and keeps the last error', async () => {
      const c = cls();
      const run = await store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: {},
        stages: [spec({ toolClass: c, maxAttempts: 2 }), spec({ toolClass: c, name: 'after' })],
      });
      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
      const lastError = { code: 'transient', message: 'upstream 503' };
      const [retry] = await store.finish('A', [
        { stageId: a!.id, fence: a!.fence, outcome: 'queued', error: lastError, retryDelayMs: 10_000 },
      ]);
      expect(retry!.accepted).toBe(true);
      expect(await store.claim({ owner: 'A', toolClass: c, limit: 1 })).toEqual([]); // backoff not yet over
      await store.clock.advance(10_001);
      const [b] = await store.claim({ owner: 'B', toolClass: c, limit: 1 });
      expect(b!.attempt).toBe(2);
      await store.clock.advance(3001); // B dies: its lease expires
      const [x] = await store.claim({ owner: 'C', toolClass: c, limit: 1 });
      expect(x!.state).toBe('failed');
      expect(x!.fence).toBe(b!.fence); // no new token for a claim that did not happen
      const r = (await store.getRun(run.id))!;
      expect(r.stages[0]!.state).toBe('failed');
      expect(r.stages[0]!.error).toMatchObject({ code: 'attempts_exhausted', attempts: 2, lastError });
      expect(r.state).toBe('failed');
      expect(r.error).toMatchObject({ code: 'attempts_exhausted', lastError });
      expect(r.stages[1]!.state).toBe('cancelled');
      const ev = await events(run.id);
      expect(ev.find((e) => e.type === 'retry_scheduled')!.data).toMatchObject({ delayMs: 10_000 });
      expect(ev.map((e) => e.type)).toContain('attempts_exhausted');
      expect(ev.map((e) => e.type)).toContain('run_failed');
    });

    // continueOnError (and an agent's tool under tell_model: its stages carry continue_on_error) at claim and extend:
    // the spent budget is a value for what follows (settleFrom), never the run's failure.
    it('a continueOnError stage whose budget is spent at claim counts as done: its successor is queued, the run goes on', async () => {
      const c = cls();
      const run = await store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: {},
        sinksLeft: 2,
        stages: [
          { ...spec({ toolClass: c, name: 'flaky', maxAttempts: 1 }), deps: [], nextSeqs: [3], continueOnError: true },
          { ...spec({ toolClass: c, name: 'side', maxAttempts: 1 }), deps: [], nextSeqs: [], continueOnError: true, sink: 'one_of' },
          { ...spec({ toolClass: `${c}_next`, name: 'after' }), deps: [1], nextSeqs: [], sink: 'one_of' },
        ],
      });
      const claimed = await store.claim({ owner: 'A', toolClass: c, limit: 2 });
      expect(claimed).toHaveLength(2);
      await store.clock.advance(3001); // A dies: both leases expire with their single attempt spent
      const x = await store.claim({ owner: 'B', toolClass: c, limit: 2 });
      expect(x.map((s) => s.state)).toEqual(['failed', 'failed']);
      let r = (await store.getRun(run.id))!;
      expect(r.state).toBe('running');
      expect(r.stages[0]!.error).toMatchObject({ code: 'attempts_exhausted', asValue: true });
      expect(r.stages[2]!.state).toBe('queued');
      const [n] = await store.claim({ owner: 'B', toolClass: `${c}_next`, limit: 1 });
      expect(n!.name).toBe('after');
      await store.finish('B', [{ stageId: n!.id, fence: n!.fence, outcome: 'succeeded', result: 'went on' }]);
      r = (await store.getRun(run.id))!;
      expect(r.state).toBe('succeeded');
      expect(r.result).toEqual({ after: 'went on', side: { ok: false, error: expect.objectContaining({ code: 'attempts_exhausted' }) } });
      const ev = await events(run.id);
      expect(ev.find((e) => e.type === 'attempts_exhausted')!.data).toMatchObject({ asValue: true });
      expect(ev.map((e) => e.type)).not.toContain('run_failed');
    });

    it('a continueOnError stage past maxDuration on its last attempt counts as done at extend: the join goes on', async () => {
      const c = cls();
      const run = await store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: {},
        sinksLeft: 1,
        stages: [
          { ...spec({ toolClass: c, name: 'slow', maxDurationMs: 5000, maxAttempts: 1 }), deps: [], nextSeqs: [3], continueOnError: true },
          { ...spec({ toolClass: `${c}_b`, name: 'b' }), deps: [], nextSeqs: [3] },
          { ...spec({ toolClass: `${c}_j`, name: 'join' }), deps: [1, 2], nextSeqs: [], sink: 'only' },
        ],
      });
      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
      const [b] = await store.claim({ owner: 'B', toolClass: `${c}_b`, limit: 1 });
      await store.finish('B', [{ stageId: b!.id, fence: b!.fence, outcome: 'succeeded', result: 'B' }]);
      await store.clock.advance(2000);
      await store.extend({ owner: 'A', leases: [{ stageId: a!.id, fence: a!.fence }] });
      await store.clock.advance(2000);
      await store.extend({ owner: 'A', leases: [{ stageId: a!.id, fence: a!.fence }] });
      await store.clock.advance(1500);
      const [ext] = await store.extend({ owner: 'A', leases: [{ stageId: a!.id, fence: a!.fence }] });
      expect(ext!.verdict).toBe('duration_exceeded');
      const r = (await store.getRun(run.id))!;
      expect(r.state).toBe('running');
      expect(r.stages[0]!.state).toBe('failed');
      expect(r.stages[0]!.error).toMatchObject({ code: 'stage_duration_exceeded', asValue: true });
      expect(r.stages[2]!.state).toBe('queued');
      expect((await events(run.id)).map((e) => e.type)).not.toContain('run_failed');
    });

    // The run graph's failures at claim (attempts_exhausted) and extend (stage_duration_exceeded): the failed
    // run's running and waiting siblings get stage_cancelled (reason run_failed), and its child runs are
    // cancelled recursively with their stages (a running grandchild stage's next extend says `cancelled`).
    for (const via of ['claim', 'extend'] as const) {
      it(`a run failed at ${via} cancels its siblings with events and its child runs recursively`, async () => {
        const c = cls();
        const kc = `${c}_kid`;
        const gc = `${c}_grandkid`;
        const long = { leaseMs: 600_000, maxDurationMs: 600_000 };
        const failing = via === 'claim' ? { maxAttempts: 1 } : { maxAttempts: 1, leaseMs: 60_000, maxDurationMs: 5000 };
        const run = await store.createRun({
          workflow: 'w',
          definitionHash: 'h',
          input: {},
          sinksLeft: 3,
          stages: [
            { ...spec({ toolClass: c, name: 'a', ...failing }), deps: [], nextSeqs: [], sink: 'one_of' },
            { ...spec({ toolClass: c, name: 'b', ...long }), deps: [], nextSeqs: [], sink: 'one_of' },
            { ...spec({ toolClass: c, name: 'sub', ...long }), deps: [], nextSeqs: [], sink: 'one_of' },
          ],
        });
        const mine = await store.claim({ owner: 'A', toolClass: c, limit: 3 });
        const by = (n: string) => mine.find((x) => x.name === n)!;
        expect(mine).toHaveLength(3);
        // sub starts a child whose only stage starts a grandchild; the grandchild's stage runs.
        const childOf = (toolClass: string) => ({
          id: randomUUID(),
          workflow: 'w',
          definitionHash: 'h',
          input: {},
          sinksLeft: null,
          stages: stageRows([stageSpecSchema.parse(spec({ toolClass, name: 'k', ...long }))], {}, 'child').map(
            (r) => JSON.parse(JSON.stringify(r)) as Record<string, unknown>,
          ),
        });
        const kid = childOf(kc);
        const [w1] = await store.finish('A', [
          { stageId: by('sub').id, fence: by('sub').fence, outcome: 'waiting', waitFor: 1, child: kid },
        ]);
        expect(w1!.accepted).toBe(true);
        const [k] = await store.claim({ owner: 'A', toolClass: kc, limit: 1 });
        const grandkid = childOf(gc);
        const [w2] = await store.finish('A', [{ stageId: k!.id, fence: k!.fence, outcome: 'waiting', waitFor: 1, child: grandkid }]);
        expect(w2!.accepted).toBe(true);
        const [g] = await store.claim({ owner: 'A', toolClass: gc, limit: 1 });
        expect(g!.runId).toBe(grandkid.id);

        if (via === 'claim') {
          await store.clock.advance(3001); // a's lease expires; its budget (1) is spent
          const [x] = await store.claim({ owner: 'B', toolClass: c, limit: 3 });
          expect(x).toMatchObject({ id: by('a').id, state: 'failed' });
        } else {
          await store.clock.advance(5000);
          const [x] = await store.extend({ owner: 'A', leases: [{ stageId: by('a').id, fence: by('a').fence }] });
          expect(x!.verdict).toBe('duration_exceeded');
        }
        const r = (await store.getRun(run.id))!;
        expect(r.state).toBe('failed');
        expect(r.stages.map((s) => s.state)).toEqual(['failed', 'cancelled', 'cancelled']);
        const cancelled = (await events(run.id)).filter((e) => e.type === 'stage_cancelled');
        cancelled.sort((x, y) => Number(BigInt(x.stageId!) - BigInt(y.stageId!)));
        expect(cancelled.map((e) => [e.stageId, e.data])).toEqual([
          [by('b').id, { previousState: 'running', reason: 'run_failed' }],
          [by('sub').id, { previousState: 'waiting', reason: 'run_failed' }],
        ]);
        for (const id of [kid.id, grandkid.id]) {
          const d = (await store.getRun(id))!;
          expect(d.state).toBe('cancelled');
          expect(d.stages.map((s) => s.state)).toEqual(['cancelled']);
          expect((await events(id)).filter((e) => e.type === 'run_cancelled').map((e) => e.data)).toEqual([{ reason: 'parent_ended' }]);
        }
        const [ext] = await store.extend({ owner: 'A', leases: [{ stageId: g!.id, fence: g!.fence }] });
        expect(ext!.verdict).toBe('cancelled');
      });
    }

    it('a finish queues the next stage with its input in the same statement; the last one ends the run', async () => {
      const c = cls();
      const run = await store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: { n: 0 },
        stages: [spec({ toolClass: c }), spec({ toolClass: c, name: 's2' })],
      });
      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 5 });
      const [v] = await store.finish('A', [
        { stageId: a!.id, fence: a!.fence, outcome: 'succeeded', result: { n: 1 }, next: { seq: 2, input: { n: 1 } } },
      ]);
      expect(v).toMatchObject({ accepted: true, nextToolClass: c });
      const [b] = await store.claim({ owner: 'A', toolClass: c, limit: 5 });
      expect(b!.id).toBe(v!.nextStageId);
      expect(b!.input).toEqual({ n: 1 });
      await store.finish('A', [
        { stageId: b!.id, fence: b!.fence, outcome: 'succeeded', result: { n: 2 }, run: { state: 'succeeded', result: { n: 2 } } },
      ]);
      const r = (await store.getRun(run.id))!;
      expect(r.state).toBe('succeeded');
      expect(r.stages.map((s) => s.state)).toEqual(['succeeded', 'succeeded']);
    });

    it('release hands the lease back at once without spending an attempt', async () => {
      const c = cls();
      await store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: c, maxAttempts: 1 })] });
      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
      const released = await store.release({ owner: 'A', leases: [{ stageId: a!.id, fence: a!.fence }] });
      expect(released.map((r) => r.stageId)).toEqual([a!.id]);
      const [b] = await store.claim({ owner: 'B', toolClass: c, limit: 1 });
      expect(b!.state).toBe('running');
      expect(b!.attempt).toBe(1);
      expect(BigInt(b!.fence)).toBeGreaterThan(BigInt(a!.fence));
      expect(await store.release({ owner: 'A', leases: [{ stageId: a!.id, fence: a!.fence }] })).toEqual([]);
    });

    it('a cancelled stage answers the heartbeat with `cancelled`, not `lost`', async () => {
      const c = cls();
      const run = await store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: c })] });
      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
      await store.transitionStage(a!.id, 'cancelled');
      const [ext] = await store.extend({ owner: 'A', leases: [{ stageId: a!.id, fence: a!.fence }] });
      expect(ext!.verdict).toBe('cancelled');
      expect(ext!.state).toBe('cancelled');
      const [fin] = await store.finish('A', [{ stageId: a!.id, fence: a!.fence, outcome: 'succeeded', result: 1 }]);
      expect(fin!.accepted).toBe(false);
      expect((await events(run.id)).find((e) => e.type === 'result_rejected')!.data).toMatchObject({ reason: 'stage_cancelled' });
    });

    it('a heartbeat after the stage went skipped or waiting under its fence is `finished`, not `lost` (no heartbeat_lost)', async () => {
      const c = cls();
      const run = await store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: {},
        stages: [spec({ toolClass: c }), spec({ toolClass: c, name: 'two' }), spec({ toolClass: c, name: 'three' })],
      });
      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
      const [skip] = await store.finish('A', [{ stageId: a!.id, fence: a!.fence, outcome: 'skipped' }]);
      expect(skip!.accepted).toBe(true);
      const [e1] = await store.extend({ owner: 'A', leases: [{ stageId: a!.id, fence: a!.fence }] });
      expect(e1).toMatchObject({ verdict: 'finished', state: 'skipped' });
      const [b] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
      const [wait] = await store.finish('A', [{ stageId: b!.id, fence: b!.fence, outcome: 'waiting', waitFor: 1 }]);
      expect(wait!.accepted).toBe(true);
      const [e2] = await store.extend({ owner: 'A', leases: [{ stageId: b!.id, fence: b!.fence }] });
      expect(e2).toMatchObject({ verdict: 'finished', state: 'waiting' });
      expect((await events(run.id)).filter((e) => e.type === 'heartbeat_lost')).toEqual([]);
    });

    it('refuses illegal transitions with a typed error and changes nothing', async () => {
      const c = cls();
      const run = await store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: {},
        stages: [spec({ toolClass: c }), spec({ toolClass: c, name: 'p' })],
      });
      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
      await store.finish('A', [{ stageId: a!.id, fence: a!.fence, outcome: 'succeeded', result: 1, next: { seq: 2, input: {} } }]);
      const before = await counts();
      await expect(store.transitionStage(a!.id, 'running')).rejects.toBeInstanceOf(IllegalTransitionError);
      await expect(store.transitionStage(a!.id, 'queued')).rejects.toMatchObject({
        code: 'illegal_transition',
        from: 'succeeded',
        to: 'queued',
      });
      await expect(store.transitionStage('424242424', 'cancelled')).rejects.toBeInstanceOf(UnknownStageError);
      await expect(
        store.finish('A', [{ stageId: a!.id, fence: a!.fence, outcome: 'pending' as 'queued', result: 1 }]),
      ).rejects.toBeInstanceOf(InvalidInputError);
      expect(await counts()).toEqual(before);
      expect((await store.getRun(run.id))!.stages[0]!.state).toBe('succeeded');
      await store.transitionStage((await store.getRun(run.id))!.stages[1]!.id, 'cancelled'); // a legal one works
    });

    it('refuses bad input with a typed error naming the path, and writes nothing', async () => {
      const c = cls();
      const circular: Record<string, unknown> = { a: 1 };
      circular.self = circular;
      const before = await counts();
      const bad: [string, () => Promise<unknown>, string][] = [
        [
          'negative lease',
          () => store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: c, leaseMs: -1 })] }),
          'createRun.stages[0].leaseMs',
        ],
        [
          'NaN timeout',
          () => store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: c, timeoutMs: Number.NaN })] }),
          'createRun.stages[0].timeoutMs',
        ],
        [
          'BigInt input',
          () => store.createRun({ workflow: 'w', definitionHash: 'h', input: { big: 10n }, stages: [spec({ toolClass: c })] }),
          'createRun.input.big',
        ],
        [
          'circular input',
          () => store.createRun({ workflow: 'w', definitionHash: 'h', input: circular, stages: [spec({ toolClass: c })] }),
          'createRun.input.self',
        ],
        [
          'NUL in a string',
          () => store.createRun({ workflow: 'w', definitionHash: 'h', input: { s: 'a\u0000b' }, stages: [spec({ toolClass: c })] }),
          'createRun.input.s',
        ],
        [
          'NUL in a stage input',
          () =>
            store.createRun({
              workflow: 'w',
              definitionHash: 'h',
              input: {},
              stages: [spec({ toolClass: c }), spec({ toolClass: c, input: ['\u0000'] })],
            }),
          'createRun.stages[1].input[0]',
        ],
        [
          'Date instance',
          () => store.createRun({ workflow: 'w', definitionHash: 'h', input: { d: new Date() }, stages: [spec({ toolClass: c })] }),
          'createRun.input.d',
        ],
        ['no stages', () => store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [] }), 'createRun.stages'],
        [
          'unknown field',
          () => store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: c })], lease: 5 } as never),
          'createRun',
        ],
        ['claim limit 0', () => store.claim({ owner: 'A', toolClass: c, limit: 0 }), 'claim.limit'],
        ['BigInt result', () => store.finish('A', [{ stageId: '1', fence: '1', outcome: 'succeeded', result: 1n }]), 'finish[0].result'],
        ['non-numeric fence', () => store.extend({ owner: 'A', leases: [{ stageId: '1', fence: 'x' }] }), 'extend.leases[0].fence'],
        [
          'negative retry delay',
          () => store.finish('A', [{ stageId: '1', fence: '1', outcome: 'queued', retryDelayMs: -5 }]),
          'finish[0].retryDelayMs',
        ],
      ];
      for (const [what, call, path] of bad) {
        const err = await call().then(
          () => null,
          (e: unknown) => e,
        );
        expect(err, what).toBeInstanceOf(InvalidInputError);
        expect((err as InvalidInputError).code, what).toBe('invalid_input');
        expect((err as InvalidInputError).path, what).toBe(path);
      }
      expect(await counts()).toEqual(before);
    });

    it('a repeated submit key returns the same run; another body under it is a conflict', async () => {
      const c = cls();
      const key = `key-${c}-${backend}`;
      const first = await store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: { a: 1 },
        idempotencyKey: key,
        stages: [spec({ toolClass: c })],
      });
      const again = await store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: { a: 1 },
        idempotencyKey: key,
        stages: [spec({ toolClass: c })],
      });
      expect(again).toMatchObject({ id: first.id, created: false });
      const before = await counts();
      await expect(
        store.createRun({ workflow: 'w', definitionHash: 'h', input: { a: 2 }, idempotencyKey: key, stages: [spec({ toolClass: c })] }),
      ).rejects.toBeInstanceOf(IdempotencyConflictError);
      expect(await counts()).toEqual(before);
    });

    it('getRun and listEvents answer null / [] for an unknown id', async () => {
      expect(await store.getRun('00000000-0000-7000-8000-000000000000')).toBeNull();
      expect(await store.getRun('not-a-uuid')).toBeNull();
      expect(await store.listEvents('not-a-uuid')).toEqual([]);
    });
  });
}
