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
});
