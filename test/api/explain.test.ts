import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Explanation } from '../../src/observability/explanation.js';
import type { Worker } from '../../src/worker/worker.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { callsOf, owe, release } from './fixtures.js';
import { startApi, until, type Api } from './helpers.js';

/**
 * explain() returns the right verdict for each state, from real runs on PostgreSQL: real
 * submits, real workers (their rows in ratchet.workers), real claims; the movable database
 * clock expires a lease without sleeping.
 */
let db: TestDatabase;
let api: Api;
let main: Worker;
let narrow: Worker;
beforeAll(async () => {
  db = await createTestDatabase('api_explain');
  api = await startApi({ databaseUrl: db.url, poolSize: 8 });
  main = api.ratchet.worker({ classes: ['quick', 'long', 'limited', 'rated', 'keyed', 'slow-retry'], pollIntervalMs: 50 });
  narrow = api.ratchet.worker({ classes: ['narrow'], concurrency: 1, pollIntervalMs: 50 });
  await main.start();
  await narrow.start();
});
afterAll(async () => {
  await api?.close();
  await db?.drop();
});

const explain = (id: string) => api.client.explain(id);
const state = async (id: string) => (await api.client.get(id)).state;
const running = (tool: string, key: string) => until(`${tool} ${key} running`, async () => callsOf(tool, key).length > 0);
const expectVerdict = <V extends Explanation['verdict']>(x: Explanation, v: V): Extract<Explanation, { verdict: V }> => {
  expect(x.verdict, x.summary).toBe(v);
  return x as Extract<Explanation, { verdict: V }>;
};

describe('explain', () => {
  it('unknown id: unknown_run from the engine, 404 unknown_run over HTTP', async () => {
    const x = await api.ratchet.explain('01890f4e-0000-7000-8000-00000000abcd');
    expect(x).toMatchObject({ verdict: 'unknown_run', runState: null, stage: null, evidence: {} });
    await expect(explain('01890f4e-0000-7000-8000-00000000abcd')).rejects.toMatchObject({ code: 'unknown_run', status: 404 });
  });

  it('queued, no worker has served the class recently', async () => {
    const { id } = await api.client.submit('orphan', { key: 'x-orphan' });
    const x = expectVerdict(await explain(id), 'queued_no_worker');
    expect(x).toMatchObject({ runState: 'queued', stage: { seq: 1, toolClass: 'orphan', state: 'queued', attempt: 0 } });
    expect(x.evidence).toMatchObject({
      toolClass: 'orphan',
      workersServingClass: 0,
      lastWorkerSeenAt: null,
      lastClassHeartbeatAt: null,
      seenWithinMs: 30_000,
    });
    expect(x.summary).toMatch(/no worker has served class orphan/);
  });

  it('running and healthy: lease remaining, heartbeat age, owner', async () => {
    const { id } = await api.client.submit('gate', { key: 'x-healthy' });
    await running('gate', 'x-healthy');
    // At least one heartbeat after the claim (its timer can be late on a loaded machine: waited for, not slept).
    const x = await until('a heartbeat after the claim', async () => {
      const e = expectVerdict(await explain(id), 'running_healthy');
      return e.evidence.heartbeatAt !== e.evidence.claimedAt && e;
    });
    expect(x.stage).toMatchObject({ name: 'gate', state: 'running', attempt: 1 });
    expect(x.evidence.owner).toBe(main.owner);
    expect(x.evidence.leaseRemainingMs).toBeGreaterThan(0);
    expect(x.evidence.leaseRemainingMs).toBeLessThanOrEqual(3000);
    expect(x.evidence.heartbeatAgeMs).toBeGreaterThanOrEqual(0);
    expect(x.evidence.heartbeatAgeMs).toBeLessThan(3000); // within the lease: a heartbeat renewed it
    expect(x.evidence.heartbeatIntervalMs).toBe(1000);
    expect(x.evidence.runningForMs).toBeGreaterThan(x.evidence.heartbeatAgeMs!);
    expect(x.summary).toMatch(/is running: attempt 1 of 3 held by .* lease \d+\.\d s left, last heartbeat \d+\.\d s ago/);
    release('x-healthy');
    await until('done', async () => (await state(id)) === 'succeeded');
  });

  it('queued at the class concurrency limit', async () => {
    const a = await api.client.submit('limited', { key: 'x-lim-a' });
    await running('limited_gate', 'x-lim-a');
    const b = await api.client.submit('limited', { key: 'x-lim-b' });
    const x = expectVerdict(await explain(b.id), 'queued_concurrency_limit');
    expect(x.evidence).toEqual({ toolClass: 'limited', liveLeases: 1, limit: 1 });
    release('x-lim-a');
    await running('limited_gate', 'x-lim-b');
    expect(expectVerdict(await explain(b.id), 'running_healthy').evidence.owner).toBe(main.owner);
    release('x-lim-b');
    await until('both done', async () => (await state(a.id)) === 'succeeded' && (await state(b.id)) === 'succeeded');
  });

  it('queued at the concurrency key limit', async () => {
    const a = await api.client.submit('keyed', { key: 'x-key-a', user: 'u-1' });
    await running('keyed_gate', 'x-key-a');
    const b = await api.client.submit('keyed', { key: 'x-key-b', user: 'u-1' });
    const other = await api.client.submit('keyed', { key: 'x-key-c', user: 'u-2' });
    await running('keyed_gate', 'x-key-c'); // another key is not held back
    const x = expectVerdict(await explain(b.id), 'queued_key_limit');
    expect(x.evidence).toEqual({ concurrencyKey: 'u-1', liveLeases: 1, limit: 1 });
    for (const k of ['x-key-a', 'x-key-c']) release(k);
    await running('keyed_gate', 'x-key-b');
    release('x-key-b');
    await until('all done', async () => (await Promise.all([a, b, other].map((r) => state(r.id)))).every((s) => s === 'succeeded'));
  });

  it('queued at the class rate limit, with when the next slot opens', async () => {
    const a = await api.client.submit('rated', { key: 'x-rate-a' });
    await until('first done', async () => (await state(a.id)) === 'succeeded');
    const b = await api.client.submit('rated', { key: 'x-rate-b' });
    await new Promise((r) => setTimeout(r, 300)); // the worker polls and is held back
    const x = expectVerdict(await explain(b.id), 'queued_rate_limited');
    expect(x.evidence).toMatchObject({ toolClass: 'rated', claimsInWindow: 1, max: 1, windowMs: 3_600_000 });
    const next = Date.parse(x.evidence.nextSlotAt!);
    expect(next - Date.parse(x.checkedAt)).toBeGreaterThan(3_500_000);
    expect(callsOf('rated_tool', 'x-rate-b')).toEqual([]);
  });

  it('queued with its retry delayed until T, with the last error', async () => {
    const { id } = await api.client.submit('delayed', { key: 'x-delay' });
    await until(
      'the first attempt failed',
      async () => (await api.client.get(id)).stages[0]!.attempt === 1 && (await api.client.get(id)).stages[0]!.state === 'queued',
    );
    const x = expectVerdict(await explain(id), 'queued_retry_delayed');
    expect(x.runState).toBe('running');
    expect(x.evidence).toMatchObject({ attemptsUsed: 1, lastError: { code: 'upstream_429' } });
    expect(x.evidence.dueInMs).toBeGreaterThan(3_590_000);
    expect(Date.parse(x.evidence.availableAt) - Date.parse(x.checkedAt)).toBe(x.evidence.dueInMs);
    expect(x.summary).toMatch(/waits for its retry until .* after 1 of 3 attempt\(s\); last error upstream_429/);
  });

  it('queued behind a backlog, and first in line', async () => {
    const n1 = await api.client.submit('narrow', { key: 'x-n1' });
    await running('narrow_gate', 'x-n1'); // the narrow worker's only slot
    const n2 = await api.client.submit('narrow', { key: 'x-n2' });
    const n3 = await api.client.submit('narrow', { key: 'x-n3' });
    const x3 = expectVerdict(await explain(n3.id), 'queued_backlog');
    expect(x3.evidence).toMatchObject({ toolClass: 'narrow', ahead: 1, liveLeases: 1, workersServingClass: 1 });
    const x2 = expectVerdict(await explain(n2.id), 'queued_ready');
    expect(x2.evidence).toMatchObject({ toolClass: 'narrow', liveLeases: 1, workersServingClass: 1 });
    expect(x2.evidence.lastWorkerSeenAt).not.toBeNull();
    for (const k of ['x-n1', 'x-n2', 'x-n3']) {
      await running('narrow_gate', k);
      release(k);
    }
    await until('all done', async () => (await Promise.all([n1, n2, n3].map((r) => state(r.id)))).every((s) => s === 'succeeded'));
  });

  it('terminal: succeeded, failed with its error, cancelled', async () => {
    const ok = await api.client.submit('echo', { key: 'x-ok' });
    await until('ok', async () => (await state(ok.id)) === 'succeeded');
    const xo = expectVerdict(await explain(ok.id), 'terminal');
    expect(xo.evidence).toMatchObject({ state: 'succeeded', result: true, error: null });
    owe('x-fail', 5);
    const bad = await api.client.submit('flaky', { key: 'x-fail' });
    await until('failed', async () => (await state(bad.id)) === 'failed');
    const xf = expectVerdict(await explain(bad.id), 'terminal');
    expect(xf.evidence).toMatchObject({
      state: 'failed',
      result: false,
      error: { code: 'attempts_exhausted', lastError: { code: 'upstream_503' } },
    });
    expect(xf.stage).toMatchObject({ seq: 1, name: 'flaky', state: 'failed', attempt: 2 });
    expect(xf.summary).toMatch(/failed .* in stage 1 \(flaky\): attempts_exhausted.*can be retried/);
    const c = await api.client.submit('orphan', { key: 'x-cancel' });
    await api.client.cancel(c.id);
    expect(expectVerdict(await explain(c.id), 'terminal').evidence).toMatchObject({ state: 'cancelled', error: { code: 'cancelled' } });
  });

  it('a passed deadline is named on a run that has not ended', async () => {
    const { id } = await api.client.submit('orphan', { key: 'x-deadline' }, { deadline: 5_000 });
    // The workers' sweepers expire a run past its deadline (FOR UPDATE SKIP LOCKED): hold its row
    // so the run is still unended when explain reads it, whenever a sweep comes.
    const pg = await import('pg');
    const holder = new pg.default.Client({ connectionString: db.url });
    await holder.connect();
    try {
      await holder.query('BEGIN');
      await holder.query('SELECT id FROM ratchet.runs WHERE id = $1 FOR UPDATE', [id]);
      await api.ratchet.store.clock.advance(6_000);
      const x = expectVerdict(await explain(id), 'queued_no_worker');
      expect(x.deadlinePassed).toBe(true);
      expect(x.summary).toMatch(/deadline has passed/);
    } finally {
      await holder.query('ROLLBACK');
      await holder.end();
      await api.ratchet.store.clock.setOffset(0);
    }
  });

  it('stuck: the lease expired and nobody reclaimed it (the owner died), by the movable database clock', async () => {
    const { id } = await api.client.submit('ghost', { key: 'x-ghost' });
    // A worker process claims the stage and dies (its claim is the real claim statement; no worker serves 'ghost' afterwards).
    const claimedBy = Date.now();
    const [claimed] = await api.ratchet.store.claim({ owner: 'dead-worker-1', toolClass: 'ghost', limit: 1 });
    expect(claimed?.runId).toBe(id);
    expect(expectVerdict(await explain(id), 'running_healthy').evidence.owner).toBe('dead-worker-1');
    await main.stop({ graceMs: 0 });
    await narrow.stop({ graceMs: 0 });
    try {
      await api.ratchet.store.clock.advance(4000); // lease 3 s
      const x = expectVerdict(await explain(id), 'stuck');
      expect(x.evidence).toMatchObject({ owner: 'dead-worker-1', fence: claimed!.fence, workersServingClass: 0 });
      expect(x.evidence.expiredForMs).toBeGreaterThanOrEqual(900);
      // 4 s advanced past a 3 s lease: 1 s, plus the real time since the claim (the workers' stops).
      expect(x.evidence.expiredForMs).toBeLessThan(1000 + (Date.now() - claimedBy) + 100);
      expect(x.summary).toMatch(/is stuck: the lease of dead-worker-1 expired \d+\.\d s ago and no worker has reclaimed it/);
    } finally {
      await api.ratchet.store.clock.setOffset(0);
    }
  });
});
