import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { apiWorkflows, owe } from '../api/fixtures.js';
import { until } from '../api/helpers.js';

/** The retry statement on both back ends: failed -> running from the failed stage, and every refusal with its reason. */
describe.each(['pglite', 'postgres'] as const)('retryRun on %s', (kind) => {
  let db: TestDatabase | undefined;
  let r: Ratchet;
  beforeAll(async () => {
    if (kind === 'postgres') db = await createTestDatabase('retry_run');
    r = await createRatchet({
      ...(db ? { databaseUrl: db.url } : { dataDir: ':memory:' }),
      workflows: apiWorkflows,
      logger: silentLogger(),
    });
    await r.worker({ classes: ['quick'], pollIntervalMs: 50 }).start();
  });
  afterAll(async () => {
    await r?.close();
    await db?.drop();
  });
  const ended = (id: string) =>
    until('ended', async () => {
      const run = await r.getRun(id);
      return run && ['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state) ? run : null;
    });

  it('moves a failed run on from its failed stages with a fresh budget; later stages are re-planned', async () => {
    owe(`${kind}-a`, 2);
    const { id } = await r.submit('flaky', { key: `${kind}-a` });
    expect((await ended(id)).state).toBe('failed');
    const res = await r.retry(id);
    expect(res).toMatchObject({
      retried: true,
      previousState: 'failed',
      reason: null,
      stage: { seq: 1, tool: 'flaky', toolClass: 'quick', attemptsUsed: 2 },
    });
    const after = await r.store.getRun(id);
    expect(after!.stages.map((s) => [s.state, s.attempt])).toEqual([
      [expect.stringMatching(/queued|running|succeeded/), expect.any(Number)],
      [expect.stringMatching(/pending|queued|running|succeeded/), expect.any(Number)],
    ]);
    const done = await ended(id);
    expect(done.state).toBe('succeeded');
    expect(done.error).toBeNull();
    expect(await r.retry(id)).toMatchObject({ retried: false, previousState: 'succeeded', reason: 'not_failed' });
  });

  it('refuses a run whose deadline has passed (resubmit it instead), and an unknown id is null', async () => {
    owe(`${kind}-b`, 2);
    const { id } = await r.submit('flaky', { key: `${kind}-b` }, { deadline: '1h' });
    expect((await ended(id)).state).toBe('failed');
    await r.store.clock.advance(2 * 3_600_000);
    try {
      expect(await r.retry(id)).toMatchObject({ retried: false, previousState: 'failed', reason: 'deadline_passed', stage: { seq: 1 } });
      expect((await r.getRun(id))!.state).toBe('failed');
      expect((await r.events(id)).some((e) => e.type === 'run_retried')).toBe(false);
    } finally {
      await r.store.clock.setOffset(0);
    }
    expect(await r.retry('01890f4e-0000-7000-8000-000000000000')).toBeNull();
    expect(await r.retry('nope')).toBeNull();
  });

  it('a retry revives every stage one statement failed: a join that waits for two failed branches runs, and the run ends', async () => {
    // A fan-out of two and their join, on a class no worker here serves (the test claims and finishes by hand).
    const c = `manual_${kind}`;
    const stage = (name: string, deps: number[], nextSeqs: number[]) => ({
      name,
      tool: name,
      toolClass: c,
      leaseMs: 3000,
      timeoutMs: 2000,
      maxDurationMs: 60_000,
      maxAttempts: 1,
      deps,
      nextSeqs,
    });
    const run = await r.store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      stages: [stage('a', [], [3]), stage('b', [], [3]), stage('j', [1, 2], [])],
    });
    const claim = () => r.store.claim({ owner: 'A', toolClass: c, limit: 10, definitions: ['h'] });
    expect(await claim()).toHaveLength(2);
    // Both leases lapse; their one attempt is spent: one claim statement fails both, and the run.
    await r.store.clock.advance(5000);
    expect((await claim()).map((s) => s.state)).toEqual(['failed', 'failed']);
    expect((await r.store.getRun(run.id))!.stages.map((s) => s.state)).toEqual(['failed', 'failed', 'cancelled']);
    const res = await r.retry(run.id);
    expect(res).toMatchObject({ retried: true, stage: { name: 'a' } });
    // Before, only `a` came back: `b` stayed failed, and `j` waited for it for good (the run running, not retryable).
    expect(res!.queued.map((q) => q.stageId).sort()).toEqual(
      (await r.store.getRun(run.id))!.stages
        .filter((s) => s.name !== 'j')
        .map((s) => s.id)
        .sort(),
    );
    expect((await r.store.getRun(run.id))!.stages.map((s) => s.state)).toEqual(['queued', 'queued', 'pending']);
    const branches = await claim();
    expect(branches.map((s) => s.state)).toEqual(['running', 'running']);
    for (const s of branches) {
      const [v] = await r.store.finish('A', [{ stageId: s.id, fence: s.fence, outcome: 'succeeded', result: { ok: s.seq } }]);
      expect(v).toMatchObject({ accepted: true });
    }
    const [join] = await claim();
    expect(join).toMatchObject({ seq: 3, state: 'running' });
    const [v] = await r.store.finish('A', [
      {
        stageId: join!.id,
        fence: join!.fence,
        outcome: 'succeeded',
        result: { done: true },
        run: { state: 'succeeded', result: { done: true } },
      },
    ]);
    expect(v).toMatchObject({ accepted: true });
    expect((await r.store.getRun(run.id))!.state).toBe('succeeded');
    const retried = (await r.events(run.id)).find((e) => e.type === 'run_retried');
    expect(retried?.data).toMatchObject({ stagesRetried: 2, stagesReplanned: 1, retriedStageIds: [...res!.retriedStageIds] });
    expect(res!.retriedStageIds).toHaveLength(2);
  });
});
