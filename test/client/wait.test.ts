import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunJson } from '../../src/api/schemas.js';
import { createClient, plannedPolls, waitForRun, type PollRecord } from '../../src/client/index.js';
import { InvalidInputError } from '../../src/errors.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { callsOf, release } from '../api/fixtures.js';
import { fakeClock, startApi, TOKEN, until, type Api } from '../api/helpers.js';

/** The bounded poller on an injected clock: against a scripted read, and against the real server on PostgreSQL. */
const runAt = (state: RunJson['state']): RunJson => ({
  id: 'r1',
  workflow: 'w',
  state,
  result: state === 'succeeded' ? { ok: true } : null,
  error: state === 'failed' ? { code: 'boom', message: 'boom' } : null,
  deadline: null,
  createdAt: '2026-01-01T00:00:00.000Z',
  updatedAt: '2026-01-01T00:00:00.000Z',
  finishedAt: null,
  stages: [],
});

describe('wait on an injected clock (scripted reads)', () => {
  it('intervals grow 1, 1.5, 2.25 ... s and stop growing at 30 s; the outcome is typed', async () => {
    const clock = fakeClock();
    let reads = 0;
    const polls: PollRecord[] = [];
    const out = await waitForRun('r1', async () => runAt(++reads < 16 ? 'running' : 'succeeded'), clock, Math.random, {
      jitter: 0,
      onPoll: (p) => polls.push(p),
      deadline: '1h',
    });
    const expected = Array.from({ length: 15 }, (_, k) => Math.round(Math.min(1000 * 1.5 ** k, 30_000)));
    expect(clock.sleeps).toEqual(expected);
    expect(clock.sleeps.slice(0, 4)).toEqual([1000, 1500, 2250, 3375]);
    expect(clock.sleeps.slice(-3)).toEqual([30_000, 30_000, 30_000]);
    expect(out).toMatchObject({
      outcome: 'succeeded',
      reason: 'terminal',
      state: 'succeeded',
      result: { ok: true },
      error: null,
      polls: 16,
    });
    expect(out.elapsedMs).toBe(expected.reduce((a, b) => a + b, 0));
    expect(polls.map((p) => p.decision)).toEqual([...Array(15).fill('wait'), 'done']);
    expect(polls[1]).toMatchObject({
      runId: 'r1',
      poll: 2,
      state: 'running',
      elapsedMs: 1000,
      intervalMs: 1500,
      decision: 'wait',
      readError: null,
    });
  });

  it('failed, cancelled and expired are outcomes with the last state and error', async () => {
    for (const s of ['failed', 'cancelled', 'expired'] as const) {
      const out = await waitForRun('r1', async () => runAt(s), fakeClock(), Math.random, {});
      expect(out).toMatchObject({ outcome: s, state: s, polls: 1 });
    }
    expect((await waitForRun('r1', async () => runAt('failed'), fakeClock(), Math.random, {})).error).toEqual({
      code: 'boom',
      message: 'boom',
    });
  });

  it('jitter draws each wait from [w × (1 − jitter), w]', async () => {
    const clock = fakeClock();
    let reads = 0;
    await waitForRun(
      'r1',
      async () => runAt(++reads < 4 ? 'queued' : 'succeeded'),
      clock,
      () => 1,
      { jitter: 0.2 },
    );
    expect(clock.sleeps).toEqual([800, 1200, 1800]);
    const c2 = fakeClock();
    reads = 0;
    await waitForRun(
      'r1',
      async () => runAt(++reads < 4 ? 'queued' : 'succeeded'),
      c2,
      () => 0,
      { jitter: 0.2 },
    );
    expect(c2.sleeps).toEqual([1000, 1500, 2250]);
  });

  it('polls are bounded: by maxPolls, and by default by what the schedule makes within the deadline', async () => {
    const clock = fakeClock();
    let reads = 0;
    const out = await waitForRun(
      'r1',
      async () => {
        reads++;
        return runAt('running');
      },
      clock,
      Math.random,
      { maxPolls: 5, deadline: '1h' },
    );
    expect(out).toMatchObject({ outcome: 'client_deadline_exceeded', reason: 'max_polls', polls: 5, state: 'running' });
    expect(reads).toBe(5);
    const c2 = fakeClock();
    reads = 0;
    const out2 = await waitForRun(
      'r1',
      async () => {
        reads++;
        return runAt('running');
      },
      c2,
      () => 0.5,
      { deadline: '10m' },
    );
    expect(out2).toMatchObject({ outcome: 'client_deadline_exceeded', reason: 'deadline' });
    expect(out2.elapsedMs).toBe(600_000);
    expect(reads).toBeLessThanOrEqual(plannedPolls(600_000, 1000, 1.5, 30_000, 0.2));
    expect(reads).toBeGreaterThan(20);
    // Every read failing still ends: the same bound holds.
    const c3 = fakeClock();
    reads = 0;
    const { ApiError } = await import('../../src/api/errors.js');
    const out3 = await waitForRun(
      'r1',
      async () => {
        reads++;
        throw new ApiError(0, 'network_error', 'ECONNREFUSED');
      },
      c3,
      Math.random,
      { deadline: '1h', maxPolls: 7 },
    );
    expect(out3).toMatchObject({
      outcome: 'client_deadline_exceeded',
      reason: 'max_polls',
      state: null,
      lastReadError: { code: 'network_error' },
      polls: 7,
    });
    expect(reads).toBe(7);
  });

  it('a 503 is retried as a read after its Retry-After; unknown_run and 401 are not retried', async () => {
    const { ApiError } = await import('../../src/api/errors.js');
    const clock = fakeClock();
    let reads = 0;
    const polls: PollRecord[] = [];
    const out = await waitForRun(
      'r1',
      async () => {
        if (++reads === 1) throw new ApiError(503, 'database_unavailable', 'db away', { retryAfterMs: 7000 });
        return runAt('succeeded');
      },
      clock,
      Math.random,
      { jitter: 0, onPoll: (p) => polls.push(p) },
    );
    expect(out.outcome).toBe('succeeded');
    expect(clock.sleeps).toEqual([7000]);
    expect(polls[0]).toMatchObject({ decision: 'retry_read', readError: 'database_unavailable', intervalMs: 7000, state: null });
    for (const err of [new ApiError(404, 'unknown_run', 'no run'), new ApiError(401, 'unauthorized', 'no')]) {
      reads = 0;
      await expect(
        waitForRun(
          'r1',
          async () => {
            reads++;
            throw err;
          },
          fakeClock(),
          Math.random,
          {},
        ),
      ).rejects.toBe(err);
      expect(reads).toBe(1);
    }
  });

  it('refuses bad options with a typed error', async () => {
    await expect(waitForRun('r1', async () => runAt('running'), fakeClock(), Math.random, { factor: 0.5 })).rejects.toBeInstanceOf(
      InvalidInputError,
    );
    await expect(waitForRun('r1', async () => runAt('running'), fakeClock(), Math.random, { deadline: 'soon' })).rejects.toMatchObject({
      code: 'invalid_input',
      path: 'wait.deadline',
    });
    await expect(waitForRun('r1', async () => runAt('running'), fakeClock(), Math.random, { jitter: 2 })).rejects.toBeInstanceOf(
      InvalidInputError,
    );
  });
});

describe('wait against the real server', () => {
  let db: TestDatabase;
  let api: Api;
  beforeAll(async () => {
    db = await createTestDatabase('client_wait');
    api = await startApi({ databaseUrl: db.url });
    await api.ratchet.worker({ classes: ['quick', 'long'], pollIntervalMs: 50 }).start();
  });
  afterAll(async () => {
    await api?.close();
    await db?.drop();
  });

  /** fetch that counts what the server is sent; `hangFirstGet` makes the first GET of a run never answer (until aborted). */
  function countingFetch(hangFirstGet = false) {
    const seen = { posts: 0, gets: 0, aborted: 0 };
    let hung = false;
    const f: typeof fetch = async (input, init) => {
      const method = init?.method ?? 'GET';
      if (method === 'POST') seen.posts++;
      else seen.gets++;
      if (method === 'GET' && hangFirstGet && !hung) {
        hung = true;
        return new Promise<Response>((_, reject) =>
          init?.signal?.addEventListener(
            'abort',
            () => {
              seen.aborted++;
              reject(init.signal!.reason);
            },
            { once: true },
          ),
        );
      }
      return fetch(input, init);
    };
    return { f, seen };
  }

  it('the deadline gives client_deadline_exceeded while the run keeps going', async () => {
    const clock = fakeClock();
    const client = createClient({ baseUrl: api.server.url, token: TOKEN, clock });
    const { id } = await client.submit('gate', { key: 'w-deadline' });
    await until('running', async () => callsOf('gate', 'w-deadline').length > 0);
    const out = await client.wait(id, { deadline: '2m', jitter: 0 });
    expect(out).toMatchObject({ outcome: 'client_deadline_exceeded', reason: 'deadline', runId: id, state: 'running', error: null });
    expect(out.elapsedMs).toBe(120_000);
    expect(clock.sleeps.reduce((a, b) => a + b, 0)).toBe(120_000);
    expect(Math.max(...clock.sleeps)).toBeLessThanOrEqual(30_000);
    expect(out.run?.stages[0]?.state).toBe('running');
    // "No longer watching", not "dead": the run goes on and ends on its own.
    expect((await client.get(id)).state).toBe('running');
    release('w-deadline');
    const done = await client.wait(id, { deadline: '10m' });
    expect(done).toMatchObject({ outcome: 'succeeded', result: { key: 'w-deadline', after: true } });
  });

  it('a status read that times out is retried as a read: the server sees one submit', async () => {
    const { f, seen } = countingFetch(true);
    const clock = fakeClock();
    const client = createClient({ baseUrl: api.server.url, token: TOKEN, clock, fetch: f });
    const sub = await client.submit('echo', { key: 'w-timeout' }, { idempotencyKey: 'w-timeout-key' });
    const polls: PollRecord[] = [];
    const t0 = Date.now();
    const out = await client.wait(sub.id, { readTimeout: 200, jitter: 0, onPoll: (p) => polls.push(p) });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(190); // the hung read was given its readTimeout, no more
    expect(out).toMatchObject({ outcome: 'succeeded', state: 'succeeded', result: { key: 'w-timeout' } });
    expect(polls[0]).toMatchObject({ decision: 'retry_read', readError: 'read_timeout', state: null, intervalMs: 1000 });
    expect(polls.at(-1)).toMatchObject({ decision: 'done', state: 'succeeded' });
    expect(seen).toEqual({ posts: 1, gets: polls.length, aborted: 1 });
    expect(await db.query('SELECT id FROM ratchet.runs WHERE idempotency_key = $1', ['w-timeout-key'])).toHaveLength(1);
    expect(
      (await db.query("SELECT count(*)::int AS n FROM ratchet.events WHERE run_id = $1 AND type = 'run_submitted'", [sub.id]))[0]!.n,
    ).toBe(1);
  });

  it('polls are bounded against a run that never ends; an unknown id is ApiError unknown_run after one read', async () => {
    const { f, seen } = countingFetch();
    const client = createClient({ baseUrl: api.server.url, token: TOKEN, clock: fakeClock(), fetch: f });
    const { id } = await client.submit('orphan', { key: 'w-bounded' });
    const out = await client.wait(id, { maxPolls: 4, deadline: '1h' });
    expect(out).toMatchObject({ outcome: 'client_deadline_exceeded', reason: 'max_polls', polls: 4, state: 'queued' });
    expect(seen.gets).toBe(4);
    seen.gets = 0;
    await expect(client.wait('01890f4e-0000-7000-8000-00000000dead')).rejects.toMatchObject({
      name: 'ApiError',
      code: 'unknown_run',
      status: 404,
    });
    expect(seen.gets).toBe(1);
  });

  it('many runs with one client: their first reads are spread, each ends with its own outcome', async () => {
    // Fake time, but each sleep also lets 50 real ms pass, and the deadline is an hour: on a loaded machine the runs
    // once took longer in real time than the 5 fake minutes' ~15 instant polls each (client_deadline_exceeded).
    const fake = fakeClock();
    const clock = {
      ...fake,
      sleep: async (ms: number) => {
        await fake.sleep(ms);
        await new Promise((r) => setTimeout(r, 50));
      },
    };
    let n = 0;
    const randoms = [0.1, 0.5, 0.9];
    const client = createClient({ baseUrl: api.server.url, token: TOKEN, clock, random: () => randoms[n++ % 3]! });
    const ids = [];
    for (let i = 0; i < 3; i++) ids.push((await client.submit('echo', { key: `w-many-${i}` })).id);
    const outs = await client.waitAll(ids, { deadline: '1h', jitter: 0 });
    expect(outs.map((o) => o.outcome)).toEqual(['succeeded', 'succeeded', 'succeeded']);
    expect(clock.sleeps.slice(0, 3)).toEqual([100, 500, 900]); // the first reads, staggered over the first interval
  });
});
