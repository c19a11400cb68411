import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createWaitService } from '../../src/api/wait-service.js';
import type { Ratchet, RunView } from '../../src/engine.js';
import type { Witness } from '../helpers/witness.js';
import { type FaultHarness, type Workers, openFaultHarness, reportAndKill, waitRun } from './helpers.js';

/**
 * Waits under worker crashes (issue 10), with real worker processes (test/fixtures/worker-process.ts)
 * and the fenced witness: a stage that waits holds nothing — no lease, no heartbeat, no worker —
 * so SIGKILLing every worker while it waits changes nothing, and the new workers carry it on.
 * Workflows: test/fixtures/fault-workflows/waits.ts.
 */
const DAY_MS = 24 * 60 * 60_000;
const SWEEP = { SWEEP_INTERVAL_MS: '200' };

describe('waits across worker crashes', () => {
  let witness: Witness;
  let r: Ratchet;
  let workers: Workers;
  let harness: FaultHarness;
  beforeAll(async () => {
    harness = await openFaultHarness('waits_faults');
    ({ witness, r, workers } = harness);
  });
  const report = reportAndKill(() => workers);
  afterEach(async (ctx) => {
    await report(ctx);
    await r.store.clock.setOffset(0);
  });
  afterAll(async () => {
    await harness.close();
  });

  const stageRows = (runId: string) =>
    r.store.db.query(
      `SELECT id::text, name, state, owner_id, lease_until, heartbeat_at, fence::text, attempt
         FROM ratchet.stages WHERE run_id = $1::uuid ORDER BY seq`,
      [runId],
    );
  const eventsOf = async (runId: string, stageId: string) =>
    (await r.events(runId)).filter((e) => e.stageId === stageId).map((e) => ({ type: e.type, fence: e.fence, data: e.data }));
  const started = (runId: string, step: string) =>
    witness.observations.filter((o) => o.kind === 'wait_effect_started' && o.runId === runId && o.step === step);

  /** Samples the run for `ms`: no stage of it is running, and the waiting stage holds no owner, lease or heartbeat. */
  async function nothingLeased(runId: string, stageId: string, ms: number) {
    const until = Date.now() + ms;
    let samples = 0;
    while (Date.now() < until) {
      const rows = await stageRows(runId);
      expect(rows.filter((s) => s.state === 'running')).toEqual([]);
      const gated = rows.find((s) => s.id === stageId)!;
      expect(gated).toMatchObject({ state: 'awaiting_approval', owner_id: null, lease_until: null, heartbeat_at: null });
      samples++;
      await new Promise((res) => setTimeout(res, 100));
    }
    return samples;
  }

  it('every worker SIGKILLed while a run awaits approval: new workers, then the approval runs the call once at the fenced receiver', async () => {
    await workers.spawn('w1', SWEEP);
    await workers.spawn('w2', SWEEP);
    const { id } = await r.submit('gated_effect', {});
    const waiting = await waitRun(r, id, (run) => run.stages[1]?.state === 'awaiting_approval', 30_000, 'the gated stage awaits approval');
    expect(waiting.stages[0]!.state).toBe('succeeded');
    const [, gatedRow] = await stageRows(id);
    const stageId = gatedRow!.id as string;
    const waitFence = gatedRow!.fence as string;

    // Live workers meanwhile (heartbeat 1 s, lease 3 s): for longer than a lease, nothing of the run is leased or heartbeated.
    expect(await nothingLeased(id, stageId, 3500)).toBeGreaterThan(5);
    const kill = workers.killAll();
    await kill;
    expect(await nothingLeased(id, stageId, 500)).toBeGreaterThan(0);

    await workers.spawn('w3', SWEEP);
    await workers.spawn('w4', SWEEP);
    // New workers find nothing to do: the stage still waits, the call has not run.
    expect(await nothingLeased(id, stageId, 1500)).toBeGreaterThan(3);
    expect(started(id, 'gated')).toEqual([]);
    const beforeDecision = await eventsOf(id, stageId);
    expect(beforeDecision.map((e) => e.type)).toEqual(['job_claimed', 'approval_requested']);

    // The person's approval: the call a route or the CLI makes.
    const decision = await createWaitService(r).approve(id, { stageId, by: 'fault test' }, 'test:fault');
    expect(decision).toMatchObject({ decision: 'approved', stageId, actor: 'fault test', runEnded: null });

    const done = await waitRun(r, id, (run) => run.state === 'succeeded', 60_000, 'run succeeded after the approval');
    const gated = done.stages[1]!;
    expect(gated).toMatchObject({ state: 'succeeded', attempt: 2 });
    expect(BigInt(gated.fence!)).toBeGreaterThan(BigInt(waitFence));
    expect(done.result).toEqual({ step: 'gated', fence: gated.fence });

    // The effect once, under the stage's key, with the approved attempt's fence; nothing stale got through.
    const applied = await witness.appliedPerKey();
    expect(applied.get(gated.idempotencyKey)).toBe(1);
    expect(applied.get(done.stages[0]!.idempotencyKey)).toBe(1);
    expect(witness.requests.filter((q) => q.key === gated.idempotencyKey).map((q) => q.fence)).toEqual([gated.fence]);
    expect(started(id, 'gated')).toHaveLength(1);
    expect(started(id, 'prepare')).toHaveLength(1);
    expect(witness.staleAccepted()).toEqual([]);

    // The history: claimed, asked, approved (by whom), claimed again, succeeded; no heartbeat while it waited.
    const types = (await eventsOf(id, stageId)).map((e) => e.type);
    const asked = types.indexOf('approval_requested');
    const granted = types.indexOf('approval_granted');
    expect(asked).toBeGreaterThanOrEqual(0);
    expect(granted).toBe(asked + 1);
    expect(types.slice(asked + 1)).toEqual(expect.arrayContaining(['approval_granted', 'job_claimed', 'stage_succeeded']));
    expect(types.filter((t) => t === 'approval_granted')).toHaveLength(1);
    expect(types.filter((t) => t === 'stage_succeeded')).toHaveLength(1);
    const grantedEvent = (await eventsOf(id, stageId)).find((e) => e.type === 'approval_granted')!;
    expect(grantedEvent.data).toMatchObject({ decidedBy: 'test:fault', actor: 'fault test' });
  }, 180_000);

  it('a week-long sleep by the movable database clock across a worker restart: the run completes, each effect once', async () => {
    const w1 = await workers.spawn('w1', SWEEP);
    const { id } = await r.submit('week_nap', {});
    const napping = await waitRun(r, id, (run) => run.stages[1]?.state === 'waiting', 30_000, 'the nap stage waits');
    expect(napping.stages[0]!.state).toBe('succeeded');
    const rows = await stageRows(id);
    const napId = rows[1]!.id as string;
    expect(rows[1]).toMatchObject({ owner_id: null, lease_until: null, heartbeat_at: null });
    const [wait] = await r.store.db.query(`SELECT kind, since, wait_until, ended_at FROM ratchet.waits WHERE stage_id = $1::bigint`, [
      napId,
    ]);
    expect(wait).toMatchObject({ kind: 'sleep', ended_at: null });
    // A week from the claim that started it (the wait row's `since` is that claim's transaction, a moment later).
    const slept = new Date(wait!.wait_until as Date).getTime() - new Date(wait!.since as Date).getTime();
    expect(slept).toBeGreaterThan(7 * DAY_MS - 10_000);
    expect(slept).toBeLessThanOrEqual(7 * DAY_MS);

    // Every worker dies mid-sleep; a new one starts (several sweeps): a restart does not end the sleep early.
    w1.proc.kill('SIGKILL');
    expect((await w1.exit).signal).toBe('SIGKILL');
    await workers.spawn('w2', SWEEP);
    await new Promise((res) => setTimeout(res, 1500));
    expect((await r.getRun(id))!.stages.map((s) => s.state)).toEqual(['succeeded', 'waiting', 'pending']);
    expect(started(id, 'after')).toEqual([]);

    // A week passes by the database clock (every process reads it): the sweeper wakes the nap, the run goes on.
    await r.store.clock.setOffset(7 * DAY_MS + 60_000);
    const done: RunView = await waitRun(r, id, (run) => run.state === 'succeeded', 60_000, 'run succeeded after the week');
    expect(done.stages.map((s) => [s.name, s.state])).toEqual([
      ['before', 'succeeded'],
      ['nap', 'succeeded'],
      ['after', 'succeeded'],
    ]);
    const [nap] = await r.store.db.query(`SELECT result FROM ratchet.stages WHERE id = $1::bigint`, [napId]);
    expect(nap!.result).toEqual({ sleptUntil: new Date(wait!.wait_until as Date).toISOString() });
    const [ended] = await r.store.db.query(`SELECT outcome, ended_at FROM ratchet.waits WHERE stage_id = $1::bigint`, [napId]);
    expect(ended!.outcome).toBe('woken');
    expect(new Date(ended!.ended_at as Date).getTime()).toBeGreaterThanOrEqual(new Date(wait!.wait_until as Date).getTime());

    // Each effect once; the nap itself began one wait and succeeded once.
    const applied = await witness.appliedPerKey();
    expect(applied.get(done.stages[0]!.idempotencyKey)).toBe(1);
    expect(applied.get(done.stages[2]!.idempotencyKey)).toBe(1);
    expect(started(id, 'before')).toHaveLength(1);
    expect(started(id, 'after')).toHaveLength(1);
    const napTypes = (await eventsOf(id, napId)).map((e) => e.type);
    expect(napTypes.filter((t) => t === 'wait_started')).toHaveLength(1);
    expect(napTypes.filter((t) => t === 'wait_ended')).toHaveLength(1);
    expect(napTypes.filter((t) => t === 'stage_succeeded')).toHaveLength(1);
    expect(napTypes).not.toContain('heartbeat_ok');
    expect(witness.staleAccepted()).toEqual([]);
  }, 180_000);
});
