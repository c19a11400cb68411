import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { callsOf, owe, release } from './fixtures.js';
import { startApi, until, type Api } from './helpers.js';

/** Cancel and retry through the real server and client, on PostgreSQL, with an in-process worker (heartbeat 1 s). */
let db: TestDatabase;
let api: Api;
const HEARTBEAT_MS = 1000;
beforeAll(async () => {
  db = await createTestDatabase('api_cancel_retry');
  api = await startApi({ databaseUrl: db.url, poolSize: 6 });
  await api.ratchet.worker({ classes: ['quick', 'long'], pollIntervalMs: 50 }).start();
});
afterAll(async () => {
  await api?.close();
  await db?.drop();
});

const settled = (id: string) =>
  until(`run ${id} to end`, async () => {
    const r = await api.client.get(id);
    return ['succeeded', 'failed', 'cancelled', 'expired'].includes(r.state) ? r : null;
  });

describe('cancel', () => {
  it("during a long stage: the tool's signal aborts with reason cancelled within two heartbeats + 1 s; the run ends cancelled; nothing after it is claimed", async () => {
    const { id } = await api.client.submit('gate', { key: 'cancel-long' });
    await until('the gate stage running', async () => callsOf('gate', 'cancel-long').length > 0);
    const t0 = Date.now();
    const res = await api.client.cancel(id);
    expect(res).toMatchObject({ id, state: 'cancelled', cancelled: true, previousState: 'running' });
    expect(res.runningStageIds).toHaveLength(1);
    expect(res.note).toMatch(/cannot be recalled/);
    const aborted = await until(
      'the abort',
      async () => callsOf('gate', 'cancel-long').find((c) => c.reason),
      2 * HEARTBEAT_MS + 1000 + 500,
    );
    expect(aborted.reason).toBe('cancelled');
    expect(aborted.at - t0).toBeLessThan(2 * HEARTBEAT_MS + 1000);
    await new Promise((r) => setTimeout(r, 1500)); // a worker would have claimed the next stage by now
    const run = await api.client.get(id);
    expect(run.state).toBe('cancelled');
    expect(run.stages.map((s) => s.state)).toEqual(['cancelled', 'cancelled']);
    expect(callsOf('after', 'cancel-long')).toEqual([]);
    const events = (await api.client.events(id)).events;
    expect(events.filter((e) => e.type === 'job_claimed').map((e) => e.stageId)).toEqual([run.stages[0]!.id]);
    expect(events.map((e) => e.type)).toContain('run_cancelled');
    // Cancel again: 200, nothing changed.
    expect(await api.client.cancel(id)).toMatchObject({
      cancelled: false,
      previousState: 'cancelled',
      note: expect.stringMatching(/already cancelled/),
    });
  });

  it('a queued run is cancelled with nothing in flight; a finished run is 409 already_terminal; an unknown id is 404 unknown_run', async () => {
    const q = await api.client.submit('orphan', { key: 'cancel-queued' });
    expect(await api.client.cancel(q.id)).toMatchObject({
      cancelled: true,
      previousState: 'queued',
      runningStageIds: [],
      note: expect.stringMatching(/nothing was in flight/),
    });
    const done = await api.client.submit('echo', { key: 'cancel-done' });
    await settled(done.id);
    const res = await api.http(`/v1/runs/${done.id}/cancel`, { method: 'POST' });
    expect(res).toMatchObject({ status: 409, body: { error: { code: 'already_terminal', details: { state: 'succeeded' } } } });
    expect((await api.client.get(done.id)).state).toBe('succeeded');
    for (const id of ['01890f4e-0000-7000-8000-000000000000', 'not-a-uuid']) {
      expect(await api.http(`/v1/runs/${id}/cancel`, { method: 'POST' })).toMatchObject({
        status: 404,
        body: { error: { code: 'unknown_run' } },
      });
    }
  });
});

describe('retry', () => {
  it('a failed run goes on from its failed stages with a fresh attempt budget; the history is kept', async () => {
    owe('retry-1', 3); // maxAttempts 2: attempts 1 and 2 fail (exhausted); after the retry, attempt 1 fails and attempt 2 succeeds
    const { id } = await api.client.submit('flaky', { key: 'retry-1' });
    const failed = await settled(id);
    expect(failed.state).toBe('failed');
    expect(failed.error).toMatchObject({ code: 'attempts_exhausted', attempts: 2 });
    expect(failed.stages.map((s) => s.state)).toEqual(['failed', 'cancelled']);
    const fencesBefore = (await api.client.events(id)).events.filter((e) => e.type === 'job_claimed').map((e) => BigInt(e.fence!));

    const res = await api.client.retry(id);
    expect(res).toMatchObject({
      id,
      state: 'running',
      previousState: 'failed',
      stage: { seq: 1, name: 'flaky', attemptsUsed: 2, error: { code: 'attempts_exhausted' } },
    });
    const done = await settled(id);
    expect(done.state).toBe('succeeded');
    expect(done.result).toEqual({ key: 'retry-1', after: true });
    expect(done.stages.map((s) => [s.state, s.attempt])).toEqual([
      ['succeeded', 2],
      ['succeeded', 1],
    ]);
    expect(callsOf('flaky', 'retry-1').map((c) => c.attempt)).toEqual([1, 2, 1, 2]);
    expect(callsOf('after', 'retry-1')).toHaveLength(1);

    const events = (await api.client.events(id)).events;
    const types = events.map((e) => e.type);
    expect(types.filter((t) => t === 'run_failed')).toHaveLength(1); // the first life is still there
    expect(types.indexOf('run_retried')).toBeGreaterThan(types.indexOf('run_failed'));
    expect(events.find((e) => e.type === 'run_retried')!.data).toMatchObject({
      seq: 1,
      attemptsUsed: 2,
      maxAttempts: 2,
      previousError: { code: 'attempts_exhausted' },
      stagesReplanned: 1,
    });
    const claims = events.filter((e) => e.type === 'job_claimed' && e.stageId === done.stages[0]!.id);
    expect(claims.map((e) => e.attempt)).toEqual([1, 2, 1, 2]);
    const fencesAfter = claims.slice(2).map((e) => BigInt(e.fence!));
    expect(fencesAfter.every((f) => fencesBefore.every((b) => f > b))).toBe(true); // tokens still only grow
    expect(types.at(-1)).toBe('run_succeeded');
  });

  it('only from failed: 409 not_retryable for a queued, running, succeeded or cancelled run (with what to do instead); 404 for an unknown id', async () => {
    const queued = await api.client.submit('orphan', { key: 'retry-queued' });
    const r1 = await api.http(`/v1/runs/${queued.id}/retry`, { method: 'POST' });
    expect(r1).toMatchObject({
      status: 409,
      body: { error: { code: 'not_retryable', details: { state: 'queued', reason: 'not_failed' } } },
    });
    expect(r1.body.error.message).toMatch(/wait for it/);
    const cancelled = await api.client.submit('orphan', { key: 'retry-cancelled' });
    await api.client.cancel(cancelled.id);
    await expect(api.client.retry(cancelled.id)).rejects.toMatchObject({
      code: 'not_retryable',
      message: expect.stringMatching(/resubmitted as a new run/),
    });
    const ok = await api.client.submit('echo', { key: 'retry-ok' });
    await settled(ok.id);
    await expect(api.client.retry(ok.id)).rejects.toMatchObject({ status: 409, code: 'not_retryable', details: { state: 'succeeded' } });
    const running = await api.client.submit('gate', { key: 'retry-running' });
    await until('running', async () => callsOf('gate', 'retry-running').length > 0);
    await expect(api.client.retry(running.id)).rejects.toMatchObject({ code: 'not_retryable', details: { state: 'running' } });
    release('retry-running');
    await settled(running.id);
    expect(await api.http('/v1/runs/01890f4e-0000-7000-8000-000000000001/retry', { method: 'POST' })).toMatchObject({
      status: 404,
      body: { error: { code: 'unknown_run' } },
    });
  });

  it('two retries at once: one moves the run, the other is 409; a retry takes no body', async () => {
    owe('retry-race', 2);
    const { id } = await api.client.submit('flaky', { key: 'retry-race' });
    expect((await settled(id)).state).toBe('failed');
    const withBody = await api.http(`/v1/runs/${id}/retry`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ input: { key: 'other' } }),
    });
    expect(withBody).toMatchObject({ status: 400, body: { error: { code: 'invalid_request' } } });
    expect((await api.client.get(id)).state).toBe('failed');
    const both = await Promise.all([
      api.http(`/v1/runs/${id}/retry`, { method: 'POST' }),
      api.http(`/v1/runs/${id}/retry`, { method: 'POST' }),
    ]);
    expect(both.map((b) => b.status).sort()).toEqual([200, 409]);
    expect((await settled(id)).state).toBe('succeeded');
    expect((await api.client.events(id)).events.filter((e) => e.type === 'run_retried')).toHaveLength(1);
  });
});
