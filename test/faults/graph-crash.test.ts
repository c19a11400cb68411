import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Ratchet } from '../../src/engine.js';
import type { Witness } from '../helpers/witness.js';
import { type FaultHarness, type Workers, openFaultHarness, reportAndKill, waitRun } from './helpers.js';

/**
 * The run graph under a real crash (issue 11): a fan-out of three and a join, the worker process
 * holding one branch SIGKILLed mid-stage (the other two branches done). Another worker reclaims
 * that branch with a greater token; at the fenced witness every stage's effect is applied once;
 * the join runs once, after all three, and the run succeeds.
 */
describe('fan-out and join with a branch worker SIGKILLed', () => {
  let witness: Witness;
  let r: Ratchet;
  let workers: Workers;
  let harness: FaultHarness;
  beforeAll(async () => {
    harness = await openFaultHarness('graph_faults');
    ({ witness, r, workers } = harness);
  });
  afterEach(reportAndKill(() => workers));
  afterAll(async () => {
    await harness.close();
  });

  it('each effect once, the join once after all three, the run succeeds', async () => {
    const w1 = await workers.spawn('w1', { STAGE_MS: '50', SLOW_MS: '4000' });
    const { id } = await r.submit('fan3', {});
    const during = await waitRun(
      r,
      id,
      (run) => run.stages[1]!.state === 'running' && run.stages[0]!.state === 'succeeded' && run.stages[2]!.state === 'succeeded',
      30_000,
      'a and c done, b running',
    );
    const fenceB = during.stages[1]!.fence!;
    w1.proc.kill('SIGKILL');
    expect((await w1.exit).signal).toBe('SIGKILL');

    await workers.spawn('w2', { STAGE_MS: '50', SLOW_MS: '100' });
    const done = await waitRun(r, id, (run) => run.state === 'succeeded', 60_000, 'run succeeded');
    expect(done.stages.map((s) => [s.name, s.state])).toEqual([
      ['a', 'succeeded'],
      ['b', 'succeeded'],
      ['c', 'succeeded'],
      ['join', 'succeeded'],
    ]);
    expect(BigInt(done.stages[1]!.fence!)).toBeGreaterThan(BigInt(fenceB));
    expect(done.stages[1]!.attempt).toBe(2);
    expect(done.stages[3]!.attempt).toBe(1);

    const applied = await witness.appliedPerKey();
    for (const s of done.stages) expect(applied.get(s.idempotencyKey), s.name).toBe(1);
    const started = (step: string) => witness.observations.filter((o) => o.kind === 'fan_started' && o.runId === id && o.step === step);
    expect(started('a')).toHaveLength(1);
    expect(started('c')).toHaveLength(1);
    expect(started('join')).toHaveLength(1); // the join ran once
    const joinRequests = witness.requests.filter((q) => q.key === done.stages[3]!.idempotencyKey);
    expect(joinRequests).toHaveLength(1);
    expect((joinRequests[0]!.body as { seen: string[] }).seen).toEqual(['a', 'b', 'c']); // after all three
    expect(witness.staleAccepted()).toEqual([]);
  });

  it('a child run whose worker is SIGKILLed mid-stage: one child, its effect once, the parent succeeds', async () => {
    const w1 = await workers.spawn('w1', { STAGE_MS: '50', SLOW_MS: '4000' });
    const { id } = await r.submit('fan3_parent', {});
    let parent = await r.store.getRun(id);
    for (let i = 0; i < 600 && (parent?.children ?? []).length === 0; i++) {
      await new Promise((res) => setTimeout(res, 50));
      parent = await r.store.getRun(id);
    }
    const parentStageId = parent!.stages[0]!.id;
    const kidId = parent!.children![0]!.id;
    const during = await waitRun(r, kidId, (run) => run.stages[0]!.state === 'running', 30_000, "the child's stage running");
    await witness.waitFor(() => witness.observations.some((o) => o.kind === 'fan_started' && o.runId === kidId), 30_000, 'kid started');
    const fenceKid = during.stages[0]!.fence!;
    expect((await r.getRun(id))!.stages[0]!.state).toBe('waiting'); // the parent waits without a lease
    w1.proc.kill('SIGKILL');
    expect((await w1.exit).signal).toBe('SIGKILL');

    await workers.spawn('w2', { STAGE_MS: '50', SLOW_MS: '100' });
    const done = await waitRun(r, id, (run) => run.state === 'succeeded', 60_000, 'parent succeeded');
    expect(done.stages.map((s) => [s.name, s.state])).toEqual([
      ['sub', 'succeeded'],
      ['end', 'succeeded'],
    ]);
    const ev = await r.events(id);
    expect(ev.filter((e) => e.type === 'child_run_started')).toHaveLength(1);
    const kids = await harness.db.query<{ id: string }>('SELECT id::text AS id FROM ratchet.runs WHERE parent_stage_id = $1', [
      parentStageId,
    ]);
    expect(kids.map((k) => k.id)).toEqual([kidId]); // exactly one child run for the stage
    const kid = (await r.store.getRun(kidId))!;
    expect(kid).toMatchObject({ state: 'succeeded', parentRunId: id, parentStageId });
    expect(BigInt(kid.stages[0]!.fence!)).toBeGreaterThan(BigInt(fenceKid));
    expect(kid.stages[0]!.attempt).toBe(2);

    const applied = await witness.appliedPerKey();
    expect(applied.get(kid.stages[0]!.idempotencyKey)).toBe(1); // the child's effect once at the fenced receiver
    expect(applied.get(done.stages[1]!.idempotencyKey)).toBe(1);
    const endRequests = witness.requests.filter((q) => q.key === done.stages[1]!.idempotencyKey);
    expect(endRequests).toHaveLength(1);
    expect((endRequests[0]!.body as { kid: { step: string } }).kid.step).toBe('kid'); // the parent resumed with the child's result
    expect(witness.staleAccepted()).toEqual([]);
  });
});
