import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Ratchet } from '../../src/engine.js';
import type { TestDatabase } from '../helpers/pg.js';
import type { Witness } from '../helpers/witness.js';
import { type FaultHarness, type Workers, openFaultHarness, reportAndKill, waitEvents, waitRun } from './helpers.js';

/** SIGTERM: stop claiming, let in-flight stages finish within the grace period, release the rest. */
describe('graceful stop on SIGTERM', () => {
  let db: TestDatabase;
  let witness: Witness;
  let r: Ratchet;
  let workers: Workers;
  let harness: FaultHarness;
  beforeAll(async () => {
    harness = await openFaultHarness('graceful');
    ({ db, witness, r, workers } = harness);
  });
  afterEach(reportAndKill(() => workers));
  afterAll(async () => {
    await harness.close();
  });

  it('an in-flight stage that fits in the grace period finishes; nothing new is claimed', async () => {
    const w1 = await workers.spawn('w1', { STAGE_MS: '3000', GRACE_MS: '8000' }); // long enough to be seen running
    const { id } = await r.submit('five', {});
    await waitRun(r, id, (run) => run.stages[0]!.state === 'running', 30_000, 'stage 1 running');
    w1.proc.kill('SIGTERM');
    expect((await w1.exit).code).toBe(0);
    const run = (await r.getRun(id))!;
    expect(run.stages[0]!.state).toBe('succeeded');
    expect(run.stages[1]!.state).toBe('queued'); // queued for the next worker, not claimed by the stopping one
    expect(run.stages[1]!.attempt).toBe(0);
  });

  it('a stage longer than the grace period is handed back at once, not left to expire', async () => {
    const w1 = await workers.spawn('w1', { STAGE_MS: '20000', GRACE_MS: '300' });
    const { id } = await r.submit('five', {});
    const running = await waitRun(r, id, (run) => run.stages[0]!.state === 'running', 30_000, 'stage 1 running');
    w1.proc.kill('SIGTERM');
    expect((await w1.exit).code).toBe(0);
    await waitEvents(r, id, (ev) => ev.some((e) => e.type === 'lease_released'), 5000, 'lease_released');
    const released = (await r.getRun(id))!;
    expect(released.stages[0]!.state).toBe('queued');
    // Released, not expired: a new worker takes it at once, and the attempt was not spent.
    await workers.spawn('w2', { STAGE_MS: '50' });
    const done = await waitRun(r, id, (run) => run.state === 'succeeded', 60_000, 'run succeeded');
    expect(done.stages[0]!.attempt).toBe(1);
    expect(BigInt(done.stages[0]!.fence!)).toBeGreaterThan(BigInt(running.stages[0]!.fence!));
    expect(witness.staleAccepted()).toEqual([]);
  });
});
