import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Ratchet } from '../../src/engine.js';
import type { TestDatabase } from '../helpers/pg.js';
import { startTcpProxy } from '../helpers/tcp-proxy.js';
import type { Witness } from '../helpers/witness.js';
import { type FaultHarness, type Workers, openFaultHarness, reportAndKill, waitEvents, waitRun } from './helpers.js';

/**
 * Real faults against real worker processes on PostgreSQL: SIGKILL, SIGSTOP/SIGCONT, a TCP
 * proxy that black-holes a worker's database link. Leases are 3 s (heartbeat 1 s). The
 * witness receiver is fenced and counts every effect.
 */
describe('crashes and partitions', () => {
  let db: TestDatabase;
  let witness: Witness;
  let r: Ratchet;
  let workers: Workers;
  let harness: FaultHarness;
  beforeAll(async () => {
    harness = await openFaultHarness('faults');
    ({ db, witness, r, workers } = harness);
  });
  afterEach(reportAndKill(() => workers));
  afterAll(async () => {
    await harness.close();
  });

  const keyOf = (runId: string, seq: number, tool: string) => `${runId}:${seq}:${tool}`;

  it('SIGKILL in the middle of stage 3 of 5: reclaimed with a greater token, stages 1 and 2 never run again', async () => {
    const w1 = await workers.spawn('w1', { STAGE_MS: '1500' });
    const { id } = await r.submit('five', {});
    const during = await waitRun(r, id, (run) => run.stages[2]!.state === 'running', 30_000, 'stage 3 running');
    const fence1 = during.stages[2]!.fence!;
    w1.proc.kill('SIGKILL');
    expect((await w1.exit).signal).toBe('SIGKILL');

    await workers.spawn('w2', { STAGE_MS: '100' });
    const done = await waitRun(r, id, (run) => run.state === 'succeeded', 60_000, 'run succeeded');
    expect(done.stages.map((s) => s.state)).toEqual(['succeeded', 'succeeded', 'succeeded', 'succeeded', 'succeeded']);
    expect(BigInt(done.stages[2]!.fence!)).toBeGreaterThan(BigInt(fence1));
    expect(done.stages[2]!.attempt).toBe(2);
    expect(done.stages[0]!.attempt).toBe(1);
    expect(done.stages[1]!.attempt).toBe(1);

    const applied = await witness.appliedPerKey();
    for (let seq = 1; seq <= 5; seq++) expect(applied.get(keyOf(id, seq, 'effect_step')), `stage ${seq}`).toBe(1);
    const requestsFor = (seq: number) => witness.requests.filter((q) => q.key === keyOf(id, seq, 'effect_step'));
    expect(requestsFor(1)).toHaveLength(1); // not executed again
    expect(requestsFor(2)).toHaveLength(1);
    const started = (seq: number) => witness.observations.filter((o) => o.kind === 'stage_started' && o.seq === seq);
    expect(started(1)).toHaveLength(1);
    expect(started(2)).toHaveLength(1);
    expect(witness.staleAccepted()).toEqual([]);
  });

  it('partition by SIGSTOP past the lease: W2 takes over; W1 cannot extend nor finish, no second effect from W1', async () => {
    const w1 = await workers.spawn('w1', { PAUSE_MS: '2000' }); // time to stop it before its second effect
    const { id } = await r.submit('partition', {});
    const first = await witness.waitFor(
      () => witness.requests.find((q) => q.key === keyOf(id, 1, 'partition_effect')),
      30_000,
      'W1 first effect',
    );
    w1.proc.kill('SIGSTOP');
    try {
      await workers.spawn('w2', { PAUSE_MS: '50' });
      const done = await waitRun(r, id, (run) => run.state === 'succeeded', 60_000, 'run succeeded by W2');
      expect(BigInt(done.stages[0]!.fence!)).toBeGreaterThan(BigInt(first.fence));
      expect((done.result as { fence: string }).fence).toBe(done.stages[0]!.fence);
    } finally {
      w1.proc.kill('SIGCONT');
    }
    // W1 learns it lost the stage: its extend says so (heartbeat_lost: the attempt ends, no finish is sent), or, when its
    // tool answered first, its finish is rejected.
    const events = await waitEvents(
      r,
      id,
      (ev) => ev.some((e) => (e.type === 'result_rejected' || e.type === 'heartbeat_lost') && e.fence === first.fence),
      30_000,
      'W1 heartbeat_lost or result_rejected',
    );
    expect(
      events.some((e) => e.type === 'heartbeat_lost' && e.fence === first.fence) || events.some((e) => e.type === 'result_rejected'),
    ).toBe(true);
    const run = (await r.getRun(id))!;
    expect((run.result as { fence: string }).fence).not.toBe(first.fence); // the run's result is W2's

    const applied = await witness.appliedPerKey();
    expect(applied.get(keyOf(id, 1, 'partition_effect'))).toBe(1);
    expect(applied.get(`${keyOf(id, 1, 'partition_effect')}:second`)).toBe(1);
    expect(witness.staleAccepted()).toEqual([]);
    const fromW1 = witness.requests.filter((q) => q.fence === first.fence && q.verdict === 'applied');
    expect(fromW1.map((q) => q.key)).toEqual([keyOf(id, 1, 'partition_effect')]); // only its first, before the partition
  });

  it('partition by a black-holed database link: same invariants; W1 learns its finish was rejected once the link returns', async () => {
    const proxy = await startTcpProxy({ target: { host: '127.0.0.1', port: Number(new URL(db.url).port) } });
    try {
      await workers.spawn('w1', { DATABASE_URL: proxy.url(db.url), PAUSE_MS: '6000' });
      const { id } = await r.submit('partition', { via: 'proxy' });
      const first = await witness.waitFor(
        () => witness.requests.find((q) => q.key === keyOf(id, 1, 'partition_effect')),
        30_000,
        'W1 first effect',
      );
      proxy.setMode('blackhole');
      await workers.spawn('w2', { PAUSE_MS: '50' });
      const done = await waitRun(r, id, (run) => run.state === 'succeeded', 60_000, 'run succeeded by W2');
      expect(BigInt(done.stages[0]!.fence!)).toBeGreaterThan(BigInt(first.fence));
      // W1's deaf pause ends while it is cut off: its second effect must be refused by beginEffect.
      const second = await witness.waitFor(
        () => witness.observations.find((o) => o.kind === 'second' && o.fence === first.fence),
        30_000,
        'W1 second attempt',
      );
      expect(second.second).toBe('refused_ownership_unknown');
      proxy.setMode('reset');
      proxy.setMode('pass');
      await waitEvents(
        r,
        id,
        (ev) =>
          ev.some((e) => e.type === 'result_rejected' && e.fence === first.fence) &&
          ev.some((e) => e.type === 'ownership_unknown' && e.fence === first.fence),
        60_000,
        'W1 result_rejected and ownership_unknown',
      );
      expect(((await r.getRun(id))!.result as { fence: string }).fence).toBe(done.stages[0]!.fence);
      const applied = await witness.appliedPerKey();
      expect(applied.get(keyOf(id, 1, 'partition_effect'))).toBe(1);
      expect(applied.get(`${keyOf(id, 1, 'partition_effect')}:second`)).toBe(1);
      expect(witness.staleAccepted()).toEqual([]);
      expect(witness.requests.filter((q) => q.fence === first.fence).map((q) => q.key)).toEqual([keyOf(id, 1, 'partition_effect')]);
    } finally {
      await proxy.close();
    }
  });

  it('a black-holed link aborts ctx.signal with ownership_unknown before lease_until; beginEffect refuses; the event lands when the link returns', async () => {
    const proxy = await startTcpProxy({ target: { host: '127.0.0.1', port: Number(new URL(db.url).port) } });
    try {
      await workers.spawn('w1', { DATABASE_URL: proxy.url(db.url), RATCHET_LOG_LEVEL: 'info' });
      const { id } = await r.submit('watch', {});
      const started = await witness.waitFor(() => witness.observations.find((o) => o.kind === 'watch_started'), 30_000, 'watch started');
      await new Promise((res) => setTimeout(res, 1500)); // a heartbeat or two go through
      proxy.setMode('blackhole');
      const aborted = await witness.waitFor(
        () => witness.observations.find((o) => o.kind === 'aborted' && o.fence === started.fence),
        20_000,
        'abort observed',
      );
      expect(aborted.reason).toBe('ownership_unknown');
      expect(aborted.refused).toBe('ownership_unknown');
      const stage = (await r.getRun(id))!.stages[0]!;
      expect(stage.fence).toBe(started.fence); // nobody took it yet: this is the lease W1 last held
      expect(aborted.at as number).toBeLessThan(stage.leaseUntil!.getTime());
      proxy.setMode('reset');
      proxy.setMode('pass');
      await waitEvents(
        r,
        id,
        (ev) => ev.some((e) => e.type === 'ownership_unknown' && e.fence === started.fence),
        30_000,
        'ownership_unknown event',
      );
      await waitRun(r, id, (run) => run.state === 'succeeded', 60_000, 'run succeeded after the link returned');
    } finally {
      await proxy.close();
    }
  });

  it('outcome unknown: an attempt that dies after beginEffect makes the next attempt reconcile first', async () => {
    const w1 = await workers.spawn('w1');
    const { id } = await r.submit('reconcile_me', {});
    expect((await w1.exit).signal).toBe('SIGKILL'); // it killed itself right after its effect
    await workers.spawn('w2');
    const done = await waitRun(r, id, (run) => run.state === 'succeeded', 60_000, 'run succeeded');
    expect(done.result).toMatchObject({ via: 'reconcile' });
    const key = keyOf(id, 1, 'crash_after_effect');
    expect((await witness.appliedPerKey()).get(key)).toBe(1);
    expect(witness.requests.filter((q) => q.key === key)).toHaveLength(1); // attempt 2 never re-sent it
    expect(witness.observations.some((o) => o.kind === 'reconcile_lookup' && o.key === key && o.found === true)).toBe(true);
    // These two are written beside the lease statements (batched), so they may land just after the finish.
    await waitEvents(
      r,
      id,
      (ev) => ev.some((e) => e.type === 'outcome_unknown') && ev.some((e) => e.type === 'reconciled'),
      10_000,
      'outcome_unknown and reconciled',
    );
  });
});
