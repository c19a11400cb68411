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

  it('moves a failed run on from its failed stage with a fresh budget; later stages are re-planned', async () => {
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
});
