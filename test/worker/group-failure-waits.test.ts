import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createServer, type ApiServer } from '../../src/api/server.js';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { PermanentError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { refreshWaitingStages } from '../../src/observability/wait-metrics.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * The group failure (issue 11) meets the waits (issue 10), through a real worker on PostgreSQL: one
 * branch of a fan-out fails for good while a sibling awaits approval and another waits for a signal.
 * Both siblings end `cancelled`, their ratchet.waits rows are closed (`cancelled`, with a wait_ended
 * event), the run fails, the waiting-stages gauge no longer counts them, and a later approve is a 409.
 * Twice: the failure told by a finish (a permanent error), and by a claim (attempts_exhausted of an
 * expired last lease: failRunsFrom).
 */
const io = defineToolClass({
  name: 'gfw_io',
  lease: '5s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '10s',
  maxDuration: '30s',
  retry: { maxAttempts: 2, backoff: { initial: '50ms' } },
});
const once = defineToolClass({
  name: 'gfw_once',
  lease: '5s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '20s',
  maxDuration: '60s',
  retry: { maxAttempts: 1 },
});
/** A long lease: moved 31 s forward, the clock passes maxDuration (30 s) before the lease, so the extend fails the attempt. */
const long = defineToolClass({
  name: 'gfw_long',
  lease: '60s',
  heartbeat: '300ms',
  jitter: '50ms',
  timeout: '20s',
  maxDuration: '30s',
  retry: { maxAttempts: 1 },
});
const released = new Set<string>();
const ran: Record<string, number> = {};
const input = z.object({ k: z.string() });
const waitFor = async (k: string, signal: AbortSignal) => {
  while (!released.has(k) && !signal.aborted) await new Promise((res) => setTimeout(res, 20));
};
const prep = defineTool({ name: 'gfw_prep', description: 'prep', class: io, input, output: z.unknown(), run: async (i) => i });
/** Fails for good once the test releases it (a finish with the run's failure). */
const boom = defineTool({
  name: 'gfw_boom',
  description: 'fails for good',
  class: once,
  input,
  output: z.unknown(),
  run: async (i, ctx) => {
    await waitFor(i.k, ctx.signal);
    throw new PermanentError('boom');
  },
});
/** Hangs until its attempt is aborted: its lease expires by the moved clock, and the claim finds its one attempt spent. */
const hang = defineTool({
  name: 'gfw_hang',
  description: 'hangs',
  class: once,
  input,
  output: z.unknown(),
  run: async (i, ctx) => {
    await waitFor(`never:${i.k}`, ctx.signal);
    throw new PermanentError('aborted');
  },
});
/** Hangs until its attempt is aborted: the extend finds it past maxDuration on its one attempt (stage_duration_exceeded). */
const overrun = defineTool({
  name: 'gfw_overrun',
  description: 'overruns',
  class: long,
  input,
  output: z.unknown(),
  run: async (i, ctx) => {
    await waitFor(`never:${i.k}`, ctx.signal);
    throw new PermanentError('aborted');
  },
});
const gatedTool = defineTool({
  name: 'gfw_gated',
  description: 'irreversible',
  class: io,
  input,
  output: z.unknown(),
  approval: true,
  approvalTimeout: '1h',
  run: async (i) => {
    ran[`gated:${i.k}`] = (ran[`gated:${i.k}`] ?? 0) + 1;
    return { done: i.k };
  },
});
const after = defineTool({
  name: 'gfw_after',
  description: 'join',
  class: io,
  input: z.unknown(),
  output: z.unknown(),
  run: async () => {
    ran.after = (ran.after ?? 0) + 1;
    return 'after';
  },
});
const fanOut = (name: string, failing: typeof boom) =>
  defineWorkflow({
    name,
    input,
    steps: [
      { tool: prep },
      { tool: failing, after: ['gfw_prep'] },
      { tool: gatedTool, after: ['gfw_prep'] },
      { waitForSignal: { name: 'go', schema: z.object({}), timeout: '1h' }, after: ['gfw_prep'] },
      { tool: after, after: [failing.name, 'gfw_gated', 'go'], input: () => ({}) },
    ],
  });
const byFinish = fanOut('gfw_by_finish', boom);
const byClaim = fanOut('gfw_by_claim', hang);
const byExtend = fanOut('gfw_by_extend', overrun);

const TOKEN = 't0123456789abcdef';

describe('a group failure closes the waits of the siblings it cancels (PostgreSQL, real worker)', () => {
  let db: TestDatabase;
  let r: Ratchet;
  let api: ApiServer;

  beforeAll(async () => {
    db = await createTestDatabase('group_failure_waits');
    r = await createRatchet({ databaseUrl: db.url, logger: silentLogger(), workflows: [byFinish, byClaim, byExtend] });
    await r.worker({ pollIntervalMs: 50, concurrency: 4, sweepIntervalMs: 150 }).start();
    api = await createServer({ ratchet: r, tokens: [TOKEN], port: 0 });
  });
  afterAll(async () => {
    await api?.close();
    await r?.close();
    await db?.drop();
  });

  const q = (text: string, params: unknown[] = []) => r.store.db.query(text, params);
  const until = async <T>(what: string, f: () => Promise<T | undefined | false>, ms = 20_000): Promise<T> => {
    const end = Date.now() + ms;
    for (;;) {
      const v = await f();
      if (v) return v;
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
      await new Promise((res) => setTimeout(res, 25));
    }
  };
  const stageIn = (id: string, name: string, state: string) =>
    until(`stage ${name} of ${id} ${state}`, async () =>
      (await r.store.getRun(id))!.stages.find((s) => s.name === name && s.state === state),
    );
  const ended = (id: string) =>
    until(`run ${id} to end`, async () => {
      const run = (await r.store.getRun(id))!;
      return ['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state) ? run : undefined;
    });
  const gauge = async () => {
    const registry = new Registry();
    await refreshWaitingStages(registry, r.store.db);
    const m = (await registry.getMetricsAsJSON()).find((x) => x.name === 'ratchet_waiting_stages')!;
    return Object.fromEntries(m.values.map((v) => [v.labels.kind, v.value]));
  };
  const approve = async (runId: string, stageId: string) =>
    (
      await fetch(`${api.url}/v1/runs/${runId}/stages/${stageId}/approve`, {
        method: 'POST',
        headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
        body: '{}',
      })
    ).status;

  /** Both siblings wait; returns their stage ids, with the gauge counting them. */
  const bothWaiting = async (id: string) => {
    const gated = await stageIn(id, 'gfw_gated', 'awaiting_approval');
    const go = await stageIn(id, 'go', 'waiting');
    const g = await gauge();
    expect(g.approval).toBeGreaterThanOrEqual(1);
    expect(g.signal).toBeGreaterThanOrEqual(1);
    return { gated: gated.id, go: go.id };
  };

  const checkClosed = async (id: string, ids: { gated: string; go: string }, failedStep: string, code?: string) => {
    const run = await ended(id);
    expect(run.state).toBe('failed');
    if (code) expect(run.error).toMatchObject({ code });
    const states = Object.fromEntries(run.stages.map((s) => [s.name, s.state]));
    expect(states).toMatchObject({
      gfw_prep: 'succeeded',
      [failedStep]: 'failed',
      gfw_gated: 'cancelled',
      go: 'cancelled',
      gfw_after: 'cancelled',
    });
    const waits = await q(
      `SELECT stage_id::text AS stage_id, kind, outcome, ended_at FROM ratchet.waits WHERE run_id = $1 ORDER BY stage_id`,
      [id],
    );
    expect(waits.map((w) => [w.stage_id, w.kind, w.outcome])).toEqual(
      [
        [ids.gated, 'approval', 'cancelled'],
        [ids.go, 'signal', 'cancelled'],
      ].sort((a, b) => Number(BigInt(a[0]!) - BigInt(b[0]!))),
    );
    expect(waits.every((w) => w.ended_at !== null)).toBe(true);
    const events = await r.events(id);
    const waitEnded = events.filter((e) => e.type === 'wait_ended').map((e) => [e.stageId, (e.data as { outcome: string }).outcome]);
    expect(waitEnded.sort()).toEqual(
      [
        [ids.gated, 'cancelled'],
        [ids.go, 'cancelled'],
      ].sort(),
    );
    const cancelledEv = events
      .filter((e) => e.type === 'stage_cancelled')
      .map((e) => [e.stageId, (e.data as { previousState: string }).previousState]);
    expect(cancelledEv).toEqual(
      expect.arrayContaining([
        [ids.gated, 'awaiting_approval'],
        [ids.go, 'waiting'],
      ]),
    );
    // no open wait of this run is counted any more
    const open = await q(`SELECT count(*)::int AS n FROM ratchet.waits WHERE run_id = $1 AND ended_at IS NULL`, [id]);
    expect(open[0]!.n).toBe(0);
    expect(await approve(id, ids.gated)).toBe(409);
    await new Promise((res) => setTimeout(res, 300));
    expect(ran[`gated:${(run.input as { k: string }).k}`]).toBeUndefined();
    expect((await r.store.getRun(id))!.stages.find((s) => s.name === 'gfw_gated')!.state).toBe('cancelled');
  };

  it('by a finish: a branch fails for good while one sibling awaits approval and another waits for a signal', async () => {
    const { id } = await r.submit('gfw_by_finish', { k: 'f1' });
    const ids = await bothWaiting(id);
    const before = await gauge();
    released.add('f1');
    await checkClosed(id, ids, 'gfw_boom');
    const after = await gauge();
    expect(after.approval).toBe(before.approval! - 1);
    expect(after.signal).toBe(before.signal! - 1);
  });

  it('by a claim (attempts_exhausted of an expired last lease, failRunsFrom): the same', async () => {
    const { id } = await r.submit('gfw_by_claim', { k: 'c1' });
    const ids = await bothWaiting(id);
    await stageIn(id, 'gfw_hang', 'running');
    const before = await gauge();
    await r.store.clock.advance(10_000); // past the 5 s lease: the next claim reclaims it and finds its one attempt spent
    try {
      await checkClosed(id, ids, 'gfw_hang', 'attempts_exhausted');
    } finally {
      await r.store.clock.setOffset(0);
    }
    const after = await gauge();
    expect(after.approval).toBe(before.approval! - 1);
    expect(after.signal).toBe(before.signal! - 1);
    const ev = (await r.events(id)).map((e) => e.type);
    expect(ev).toContain('attempts_exhausted');
  });

  it('by an extend (stage_duration_exceeded on the last attempt, failRunsFrom): the same', async () => {
    const { id } = await r.submit('gfw_by_extend', { k: 'e1' });
    const ids = await bothWaiting(id);
    await stageIn(id, 'gfw_overrun', 'running');
    await r.store.clock.advance(31_000); // past maxDuration (30 s), not past the 60 s lease: the next extend fails it
    try {
      await checkClosed(id, ids, 'gfw_overrun', 'stage_duration_exceeded');
    } finally {
      await r.store.clock.setOffset(0);
    }
    expect((await r.events(id)).map((e) => e.type)).toContain('stage_duration_exceeded');
  });
});
