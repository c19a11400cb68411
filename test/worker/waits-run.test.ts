import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { startScriptedModel, type ScriptedAnswer, type ScriptedModel } from '../../src/agent/scripted-model.js';
import { createServer, type ApiServer } from '../../src/api/server.js';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import { TransientError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { processMetrics } from '../../src/observability/metrics.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startWitness, type Witness } from '../helpers/witness.js';

/**
 * Waits (issue 10) through a real worker on PostgreSQL: approval gates (static steps and agent
 * calls) with the tool's effect counted at the fenced receiver, signals (kept before the wait,
 * delivered once per Signal-Id, timed out by the movable database clock), sleeps (a week, across a
 * worker restart), cancel and deadlines during a wait, and a wait inside a fan-out. Nothing is
 * leased while a stage waits. (Workers SIGKILLed while waiting: test/faults, issue 10's demo.)
 */
const io = defineToolClass({
  name: 'wr_io',
  lease: '5s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '10s',
  maxDuration: '30s',
  retry: { maxAttempts: 2, backoff: { initial: '50ms' } },
});
const llm = defineToolClass({
  name: 'wr_llm',
  lease: '5s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '4s',
  maxDuration: '30s',
  retry: { maxAttempts: 2, backoff: { initial: '50ms' } },
});
let witnessUrl = '';
const caseInput = z.object({ invoiceId: z.string().min(1), amount: z.number().positive() });
/** The irreversible call: one fenced request to the witness per effect. */
const createCase = defineTool({
  name: 'create_case',
  description: 'files a case (irreversible)',
  class: io,
  input: caseInput,
  output: z.object({ caseId: z.string() }),
  approval: true,
  approvalTimeout: '1h',
  idempotencyKey: (i) => `case:${i.invoiceId}`,
  run: async (i, ctx) => {
    ctx.beginEffect(`case:${i.invoiceId}`);
    const res = await fetch(`${witnessUrl}/effect`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': ctx.idempotencyKey, 'x-execution-fence': ctx.fence },
      body: JSON.stringify(i),
    });
    if (res.status >= 500) throw new TransientError(`witness ${res.status}`);
    return { caseId: `case-${i.invoiceId}` };
  },
});
/** A gate that asks only above 100. */
const refund = defineTool({
  name: 'refund',
  description: 'refunds',
  class: io,
  input: caseInput,
  output: z.object({ refunded: z.number() }),
  approval: (i) => i.amount > 100,
  run: async (i) => ({ refunded: i.amount }),
});
/** A gated call that always fails transiently: after its approval it must still have its whole budget (wr_io: 2 attempts). */
let stubbornCalls = 0;
const stubborn = defineTool({
  name: 'stubborn_gated',
  description: 'asks, then fails every time',
  class: io,
  input: z.object({}),
  output: z.object({}),
  approval: true,
  run: async () => {
    stubbornCalls++;
    throw new TransientError('still down');
  },
});
const seen: Record<string, unknown[]> = {};
let prepGate: Promise<void> = Promise.resolve();
const tool = (name: string, run: (input: unknown) => unknown = (input) => ({ [name]: input })) =>
  defineTool({
    name,
    description: name,
    class: io,
    input: z.unknown(),
    output: z.unknown(),
    run: async (input) => {
      (seen[name] ??= []).push(input);
      if (name === 'prep') await prepGate;
      return run(input);
    },
  });
const prep = tool('prep', () => ({ prepared: true }));
const ship = tool('ship');
const left = tool('left', () => 'L');
const join = tool('join');
const paid = z.object({ paid: z.boolean(), ref: z.string() });

const gated = defineWorkflow({ name: 'wr_gated', input: caseInput, steps: [{ tool: createCase }, { tool: ship }] });
const refunds = defineWorkflow({ name: 'wr_refunds', input: caseInput, steps: [{ tool: refund }] });
/** Two gates side by side (both roots): their approvals time out in the same sweep. */
const twinGates = defineWorkflow({
  name: 'wr_twin_gates',
  input: z.object({}),
  steps: [
    { name: 'case_a', tool: createCase, input: () => ({ invoiceId: 'twin-a', amount: 1 }), after: [] },
    { name: 'case_b', tool: createCase, input: () => ({ invoiceId: 'twin-b', amount: 2 }), after: [] },
  ],
});
const batch = defineWorkflow({
  name: 'wr_batch',
  input: z.object({ amounts: z.array(z.number()) }),
  steps: [
    {
      name: 'refunds',
      map: { items: ({ input }) => input.amounts, tool: refund, input: (amount: number, i: number) => ({ invoiceId: `b-${i}`, amount }) },
    },
  ],
});
/** The same map whose failures are values: a refused item is `{ ok: false, error }` in its place, the run goes on. */
const batchKept = defineWorkflow({
  name: 'wr_batch_kept',
  input: z.object({ amounts: z.array(z.number()) }),
  steps: [
    {
      name: 'refunds',
      continueOnError: true,
      map: { items: ({ input }) => input.amounts, tool: refund, input: (amount: number, i: number) => ({ invoiceId: `k-${i}`, amount }) },
    },
  ],
});
const stubbornRun = defineWorkflow({ name: 'wr_stubborn', input: z.object({}), steps: [{ tool: stubborn }] });
const hooked = defineWorkflow({
  name: 'wr_hooked',
  input: z.object({}),
  steps: [
    { tool: prep },
    { waitForSignal: { name: 'paid', schema: paid, timeout: '1h' } },
    { tool: ship, input: ({ results }) => results.paid },
  ],
});
const patient = defineWorkflow({
  name: 'wr_patient',
  input: z.object({}),
  steps: [
    { waitForSignal: { name: 'ack', schema: z.object({}), timeout: '1h', onTimeout: () => ({ acked: false, byTimeout: true }) } },
    { tool: ship, input: ({ results }) => results.ack },
  ],
});
const napper = defineWorkflow({
  name: 'wr_napper',
  input: z.object({}),
  steps: [{ sleep: '7d' }, { tool: ship, input: ({ results }) => results.sleep }],
});
const forked = defineWorkflow({
  name: 'wr_forked',
  input: z.object({}),
  steps: [
    { tool: prep },
    { tool: left, after: ['prep'] },
    { waitForSignal: { name: 'go', schema: z.object({ n: z.number() }), timeout: '1h' }, after: ['prep'] },
    { tool: join, after: ['left', 'go'], input: ({ results }) => results },
  ],
});

const TOKEN = 't0123456789abcdef';
const post = async (url: string, body?: unknown, headers: Record<string, string> = {}) => {
  const res = await fetch(url, {
    method: 'POST',
    headers: { authorization: `Bearer ${TOKEN}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  });
  return { status: res.status, body: (await res.json()) as Record<string, any> };
};

describe('waits through a real worker (PostgreSQL)', () => {
  let db: TestDatabase;
  let r: Ratchet;
  let api: ApiServer;
  let witness: Witness;
  let model: ScriptedModel;
  let script: ScriptedAnswer[] = [];
  let served = 0;
  const startWorker = async () => {
    const w = r.worker({ pollIntervalMs: 50, concurrency: 4, sweepIntervalMs: 150 });
    await w.start();
    return w;
  };
  let worker: Awaited<ReturnType<typeof startWorker>>;

  beforeAll(async () => {
    db = await createTestDatabase('waits_run');
    witness = await startWitness(db.url);
    witnessUrl = witness.url;
    model = await startScriptedModel({ script: () => script[served++] ?? { content: 'done' } });
    const agent = defineAgent({
      name: 'wr_agent',
      input: z.object({ invoiceId: z.string() }),
      model: { name: 'scripted', class: llm, baseURL: model.baseURL },
      instructions: 'File the case.',
      tools: [createCase],
      allowSleep: { max: '1d' },
    });
    r = await createRatchet({
      databaseUrl: db.url,
      logger: silentLogger(),
      workflows: [gated, refunds, batch, batchKept, stubbornRun, hooked, patient, napper, forked, agent, twinGates],
    });
    worker = await startWorker();
    api = await createServer({ ratchet: r, tokens: [TOKEN], port: 0 });
  });
  afterAll(async () => {
    await api?.close();
    await r?.close();
    await model?.close();
    await witness?.close();
    await db?.drop();
  });

  const q = (text: string, params: unknown[] = []) => r.store.db.query(text, params);
  const until = async <T>(what: string, f: () => Promise<T | undefined | false>, ms = 15_000): Promise<T> => {
    const end = Date.now() + ms;
    for (;;) {
      const v = await f();
      if (v) return v;
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
      await new Promise((res) => setTimeout(res, 25));
    }
  };
  const ended = (id: string) =>
    until(`run ${id} to end`, async () => {
      const run = (await r.store.getRun(id))!;
      return ['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state) ? run : undefined;
    });
  const stageIn = (id: string, name: string, state: string) =>
    until(`stage ${name} of ${id} ${state}`, async () => {
      const run = (await r.store.getRun(id))!;
      return run.stages.find((s) => s.name === name && s.state === state);
    });
  /** Nothing of the run is leased: no running stage, no owner, no lease, no heartbeat. */
  const holdsNothing = async (runId: string) => {
    const rows = await q(
      `SELECT count(*)::int AS n FROM ratchet.stages WHERE run_id = $1 AND (state = 'running' OR owner_id IS NOT NULL AND state IN ('waiting','awaiting_approval') OR lease_until IS NOT NULL AND state IN ('waiting','awaiting_approval') OR heartbeat_at IS NOT NULL AND state IN ('waiting','awaiting_approval'))`,
      [runId],
    );
    expect(rows[0]!.n).toBe(0);
  };
  const waitRow = async (stageId: string) =>
    (await q(`SELECT kind, outcome, decided_by, reason, input_hash FROM ratchet.waits WHERE stage_id = $1`, [stageId]))[0];
  const moveClock = async (ms: number, then: () => Promise<void>) => {
    await r.store.clock.advance(ms);
    try {
      await then();
    } finally {
      await r.store.clock.setOffset(0);
    }
  };
  const url = (path: string) => `${api.url}${path}`;

  describe('approval gates', () => {
    it('a static gated step waits holding nothing; an edit the schema refuses is 422 with nothing changed; approve with an edit runs the tool once, with the edit; never asked again', async () => {
      const { id } = await r.submit('wr_gated', { invoiceId: 'inv-a1', amount: 120 });
      const s = await stageIn(id, 'create_case', 'awaiting_approval');
      await holdsNothing(id);
      expect(s.input).toEqual({ invoiceId: 'inv-a1', amount: 120 });
      expect((await r.explain(id)).verdict).toBe('awaiting_approval');

      const before = await q(`SELECT (SELECT count(*) FROM ratchet.events WHERE run_id = $1)::int AS ev`, [id]);
      const bad = await post(url(`/v1/runs/${id}/stages/${s.id}/approve`), { input: { invoiceId: 'inv-a1', amount: -1 } });
      expect(bad.status).toBe(422);
      expect(bad.body.error).toMatchObject({ code: 'invalid_input', path: 'input.amount' });
      expect(await q(`SELECT (SELECT count(*) FROM ratchet.events WHERE run_id = $1)::int AS ev`, [id])).toEqual(before);
      expect((await waitRow(s.id))!.outcome).toBeNull();

      const ok = await post(url(`/v1/runs/${id}/stages/${s.id}/approve`), {
        input: { invoiceId: 'inv-a1', amount: 100 },
        reason: 'capped',
      });
      expect(ok.status).toBe(200);
      const run = await ended(id);
      expect(run.state).toBe('succeeded');
      expect(run.stages.find((x) => x.name === 'create_case')!.result).toEqual({ caseId: 'case-inv-a1' });
      const applied = await witness.appliedPerKey();
      expect(applied.get('case:inv-a1')).toBe(1);
      expect(witness.requests.filter((q) => q.key === 'case:inv-a1').map((q) => q.body)).toEqual([{ invoiceId: 'inv-a1', amount: 100 }]);
      const types = (await r.events(id)).map((e) => e.type);
      expect(types.filter((t) => t === 'approval_requested')).toHaveLength(1);
      expect(types.filter((t) => t === 'approval_granted')).toHaveLength(1);
      const again = await post(url(`/v1/runs/${id}/stages/${s.id}/approve`), {});
      expect([again.status, again.body.error.code]).toEqual([409, 'already_decided']);
    });

    it('reject in a static run: no effect, the run fails approval_rejected with who and why; a retry asks again (a new wait)', async () => {
      const { id } = await r.submit('wr_gated', { invoiceId: 'inv-r1', amount: 5 });
      const s = await stageIn(id, 'create_case', 'awaiting_approval');
      const no = await post(url(`/v1/runs/${id}/stages/${s.id}/reject`), { reason: 'duplicate invoice', by: 'Ana' });
      expect(no.status).toBe(200);
      const run = await ended(id);
      expect(run.state).toBe('failed');
      expect(run.error).toMatchObject({ code: 'approval_rejected', details: { reason: 'duplicate invoice' } });
      expect(run.stages.map((x) => x.state)).toEqual(['failed', 'cancelled']);
      expect((await witness.appliedPerKey()).get('case:inv-r1')).toBeUndefined();
      expect(seen.ship ?? []).not.toContainEqual({ caseId: 'case-inv-r1' });

      await r.retry(id);
      await stageIn(id, 'create_case', 'awaiting_approval');
      expect((await waitRow(s.id))!.outcome).toBeNull(); // asked again
      await post(url(`/v1/runs/${id}/stages/${s.id}/approve`), {});
      expect((await ended(id)).state).toBe('succeeded');
      expect((await witness.appliedPerKey()).get('case:inv-r1')).toBe(1);
    });

    it('approval(input) decides per call: under the limit the tool runs without asking', async () => {
      const small = await ended((await r.submit('wr_refunds', { invoiceId: 'x', amount: 50 })).id);
      expect(small.state).toBe('succeeded');
      expect((await waitRow(small.stages[0]!.id)) ?? null).toBeNull();
      const { id } = await r.submit('wr_refunds', { invoiceId: 'y', amount: 500 });
      await stageIn(id, 'refund', 'awaiting_approval');
      await r.cancel(id);
    });

    it('a map of a gated tool: each item asks for itself (only the one over the limit waits); approved, the map gathers in order', async () => {
      const { id } = await r.submit('wr_batch', { amounts: [50, 500, 70] });
      const big = await until('an item awaiting approval', async () =>
        (await r.store.getRun(id))!.stages.find((s) => s.state === 'awaiting_approval'),
      );
      const [lease] = await q(`SELECT owner_id, lease_until, heartbeat_at FROM ratchet.stages WHERE id = $1`, [big.id]);
      expect(lease).toEqual({ owner_id: null, lease_until: null, heartbeat_at: null });
      expect(big!.input).toEqual({ invoiceId: 'b-1', amount: 500 });
      expect((await post(url(`/v1/runs/${id}/stages/${big!.id}/approve`), {})).status).toBe(200);
      const run = await ended(id);
      expect(run.state).toBe('succeeded');
      expect(run.result).toEqual([{ refunded: 50 }, { refunded: 500 }, { refunded: 70 }]);
    });

    it('an approved call keeps its whole attempt budget: the claim that began the wait is not one of the tool’s attempts', async () => {
      const { id } = await r.submit('wr_stubborn', {});
      const waiting = await stageIn(id, 'stubborn_gated', 'awaiting_approval');
      expect((await post(url(`/v1/runs/${id}/stages/${waiting.id}/approve`), {})).status).toBe(200);
      const run = await ended(id);
      expect(run.state).toBe('failed');
      expect(run.error).toMatchObject({ code: 'attempts_exhausted' });
      expect(stubbornCalls).toBe(2); // wr_io's maxAttempts
    });

    it('a map item rejected under continueOnError: the refusal is a value in its place, the map and the run go on (as its timeout would)', async () => {
      const { id } = await r.submit('wr_batch_kept', { amounts: [50, 500, 70] });
      const big = await until('an item awaiting approval', async () =>
        (await r.store.getRun(id))!.stages.find((s) => s.state === 'awaiting_approval'),
      );
      const res = await post(url(`/v1/runs/${id}/stages/${big!.id}/reject`), { reason: 'too much' });
      expect(res.status).toBe(200);
      expect(res.body.runEnded).toBeFalsy();
      const run = await ended(id);
      expect(run.state).toBe('succeeded');
      const result = run.result as unknown[];
      expect(result[0]).toEqual({ refunded: 50 });
      expect(result[1]).toMatchObject({ ok: false, error: { code: 'approval_rejected' } });
      expect(result[2]).toEqual({ refunded: 70 });
    });

    it('an agent: approve → the tool runs once; reject → no effect, the next model call hears the rejection and the run ends as the model says', async () => {
      served = 0;
      script = [
        { toolCalls: [{ id: 'call_1', name: 'create_case', arguments: { invoiceId: 'inv-g1', amount: 10 } }] },
        { toolCalls: [{ id: 'call_2', name: 'create_case', arguments: { invoiceId: 'inv-g2', amount: 20 } }] },
        { content: 'one filed, one refused' },
      ];
      const { id } = await r.submit('wr_agent', { invoiceId: 'inv-g' });
      const c1 = await stageIn(id, 'call_1', 'awaiting_approval');
      await holdsNothing(id);
      expect((await post(url(`/v1/runs/${id}/stages/${c1.id}/approve`), {})).status).toBe(200);
      const c2 = await stageIn(id, 'call_2', 'awaiting_approval');
      expect((await witness.appliedPerKey()).get('case:inv-g1')).toBe(1);
      expect((await post(url(`/v1/runs/${id}/stages/${c2.id}/reject`), { reason: 'not this one' })).status).toBe(200);
      const run = await ended(id);
      expect(run.state).toBe('succeeded');
      expect(run.result).toEqual({ answer: 'one filed, one refused' });
      expect((await witness.appliedPerKey()).get('case:inv-g2')).toBeUndefined();
      const third = model.requests[model.requests.length - 1]!;
      const answer = third.messages.find((m) => m.role === 'tool' && m.tool_call_id === 'call_2');
      expect(JSON.parse(answer!.content as string)).toMatchObject({ error: 'approval_rejected', reason: 'not this one' });
      expect(third.tools!.map((t) => t.function.name).sort()).toEqual(['create_case', 'sleep']); // allowSleep offers the built-in tool
    });

    it('an agent sleeps with the built-in tool (a refusal above its max is the tool answer), woken by the movable clock', async () => {
      served = 0;
      script = [
        { toolCalls: [{ id: 'nap_1', name: 'sleep', arguments: { seconds: 3 * 86_400 } }] },
        { toolCalls: [{ id: 'nap_2', name: 'sleep', arguments: { seconds: 3600 } }] },
        { content: 'rested' },
      ];
      const { id } = await r.submit('wr_agent', { invoiceId: 'inv-s' });
      const nap = await stageIn(id, 'nap_2', 'waiting');
      await holdsNothing(id);
      const first = (await r.store.getRun(id))!.stages.find((s) => s.name === 'nap_1')!;
      expect(first.result).toMatchObject({ error: 'sleep_too_long' });
      // The run ends before the clock goes back: the model's next turn, queued at the moved clock's time, would
      // otherwise wait an hour of the clock put back (a loaded machine claimed it after the reset once).
      await moveClock(3600_000 + 1000, async () => {
        await stageIn(id, 'nap_2', 'succeeded');
        await ended(id);
      });
      const run = (await r.store.getRun(id))!;
      expect(run.state).toBe('succeeded');
      expect((await r.store.getRun(id))!.stages.find((s) => s.id === nap.id)!.result).toHaveProperty('sleptUntil');
    });

    it('an approval times out by the movable clock: approval_timeout, the run fails, the decision-time metric counts it', async () => {
      const { id } = await r.submit('wr_gated', { invoiceId: 'inv-t1', amount: 3 });
      const s = await stageIn(id, 'create_case', 'awaiting_approval');
      await moveClock(3600_000 + 1000, async () => {
        await ended(id);
      });
      const run = (await r.store.getRun(id))!;
      expect(run.state).toBe('failed');
      expect(run.error).toMatchObject({ code: 'approval_timeout' });
      expect((await waitRow(s.id))!.outcome).toBe('timed_out');
      const late = await post(url(`/v1/runs/${id}/stages/${s.id}/approve`), {});
      expect([late.status, late.body.error.code]).toEqual([409, 'already_decided']);
      const text = await processMetrics().registry.metrics();
      expect(text).toMatch(/ratchet_waits_ended_total\{kind="approval",outcome="timed_out"\} [1-9]/);
      expect(text).toMatch(/ratchet_approval_decision_seconds_count\{outcome="timed_out"\} [1-9]/);
    });

    it('two approvals time out in one sweep: the first fails the run, the second stage stays cancelled with its wait (never cancelled -> failed)', async () => {
      const { id } = await r.submit('wr_twin_gates', {});
      const a = await stageIn(id, 'case_a', 'awaiting_approval');
      const b = await stageIn(id, 'case_b', 'awaiting_approval');
      await moveClock(3600_000 + 1000, async () => {
        await ended(id);
      });
      const run = (await r.store.getRun(id))!;
      expect(run.state).toBe('failed');
      expect(run.error).toMatchObject({ code: 'approval_timeout' });
      // One stage timed out and failed the run; the run's failure cancelled the other and closed its wait.
      expect(run.stages.map((s) => s.state).sort()).toEqual(['cancelled', 'failed']);
      const [failed, cancelled] = run.stages.find((s) => s.id === a.id)!.state === 'failed' ? [a, b] : [b, a];
      expect((await waitRow(failed.id))!.outcome).toBe('timed_out');
      expect((await waitRow(cancelled.id))!.outcome).toBe('cancelled');
      const ev = (await r.events(id)).filter((e) => e.stageId === cancelled.id).map((e) => e.type);
      expect(ev).not.toContain('approval_timed_out');
      expect(ev).not.toContain('stage_failed');
      expect(ev.filter((t) => t === 'stage_cancelled')).toHaveLength(1);
    });
  });

  describe('signals', () => {
    it('sent before the wait: kept (202), consumed once when the wait starts; the same Signal-Id again is one delivery', async () => {
      let release!: () => void;
      prepGate = new Promise<void>((res) => (release = res));
      const { id } = await r.submit('wr_hooked', {});
      await stageIn(id, 'prep', 'running');
      const sent = await post(url(`/v1/runs/${id}/signals/paid`), { paid: true, ref: 'tx-1' }, { 'signal-id': 'sig-1' });
      expect([sent.status, sent.body.status]).toEqual([202, 'kept']);
      const dup = await post(url(`/v1/runs/${id}/signals/paid`), { paid: true, ref: 'tx-1' }, { 'signal-id': 'sig-1' });
      expect(dup.body).toMatchObject({ duplicate: true, status: 'kept' });
      release();
      prepGate = Promise.resolve();
      const run = await ended(id);
      expect(run.state).toBe('succeeded');
      expect(run.result).toEqual({ ship: { paid: true, ref: 'tx-1' } });
      const sig = await q(`SELECT count(*)::int AS n, count(consumed_at)::int AS c FROM ratchet.signals WHERE run_id = $1`, [id]);
      expect(sig[0]).toEqual({ n: 1, c: 1 });
      const again = await post(url(`/v1/runs/${id}/signals/paid`), { paid: true, ref: 'tx-1' }, { 'signal-id': 'sig-1' });
      expect(again.body).toMatchObject({ duplicate: true, status: 'delivered' });
    });

    it('sent to the waiting stage: delivered (200) and what follows runs; a wait holds nothing', async () => {
      const { id } = await r.submit('wr_hooked', {});
      const s = await stageIn(id, 'paid', 'waiting');
      await holdsNothing(id);
      expect((await r.explain(id)).verdict).toBe('waiting_for_signal');
      const d = await post(url(`/v1/runs/${id}/signals/paid`), { paid: false, ref: 'tx-2' }, { 'signal-id': 'sig-2' });
      expect([d.status, d.body.status, d.body.stageId]).toEqual([200, 'delivered', s.id]);
      const dup = await post(url(`/v1/runs/${id}/signals/paid`), { paid: false, ref: 'tx-2' }, { 'signal-id': 'sig-2' });
      expect(dup.body).toMatchObject({ duplicate: true, status: 'delivered' });
      const run = await ended(id);
      expect(run.result).toEqual({ ship: { paid: false, ref: 'tx-2' } });
      expect(seen.ship!.filter((x) => (x as { ref?: string }).ref === 'tx-2')).toHaveLength(1);
    });

    it('a timeout by the movable clock: signal_timeout fails the run; a retry waits again; onTimeout gives a value instead', async () => {
      const { id } = await r.submit('wr_hooked', {});
      const s = await stageIn(id, 'paid', 'waiting');
      await moveClock(3600_000 + 1000, async () => {
        await ended(id);
      });
      const run = (await r.store.getRun(id))!;
      expect(run.state).toBe('failed');
      expect(run.error).toMatchObject({ code: 'signal_timeout' });
      expect((await waitRow(s.id))!.outcome).toBe('timed_out');
      await r.retry(id);
      await until('a new wait', async () => (await waitRow(s.id))?.outcome === null);
      await post(url(`/v1/runs/${id}/signals/paid`), { paid: true, ref: 'late' });
      expect((await ended(id)).state).toBe('succeeded');

      const p = await r.submit('wr_patient', {});
      await stageIn(p.id, 'ack', 'waiting');
      await moveClock(3600_000 + 1000, async () => {
        await ended(p.id);
      });
      const pr = (await r.store.getRun(p.id))!;
      expect(pr.state).toBe('succeeded');
      expect(pr.result).toEqual({ ship: { acked: false, byTimeout: true } });
    });

    it('a wait inside a fan-out: one branch waits for a signal, the join runs once after it with both results', async () => {
      const before = seen.join?.length ?? 0;
      const { id } = await r.submit('wr_forked', {});
      await stageIn(id, 'go', 'waiting');
      await stageIn(id, 'left', 'succeeded');
      expect((await r.store.getRun(id))!.stages.find((s) => s.name === 'join')!.state).toBe('pending');
      await post(url(`/v1/runs/${id}/signals/go`), { n: 7 });
      const run = await ended(id);
      expect(run.state).toBe('succeeded');
      expect(run.result).toEqual({ join: { prep: { prepared: true }, left: 'L', go: { n: 7 } } });
      expect((seen.join?.length ?? 0) - before).toBe(1);
    });
  });

  describe('runs that end while they wait', () => {
    it('cancel during a wait: the wait is closed (cancelled), nothing after it runs', async () => {
      const shipsBefore = seen.ship?.length ?? 0;
      const { id } = await r.submit('wr_hooked', {});
      const s = await stageIn(id, 'paid', 'waiting');
      await r.cancel(id);
      expect((await waitRow(s.id))!.outcome).toBe('cancelled');
      const late = await post(url(`/v1/runs/${id}/signals/paid`), { paid: true, ref: 'x' });
      expect([late.status, late.body.error.code]).toEqual([409, 'already_terminal']);
      await new Promise((res) => setTimeout(res, 300));
      expect((await r.store.getRun(id))!.stages.map((x) => x.state)).toEqual(['succeeded', 'cancelled', 'cancelled']);
      expect(seen.ship?.length ?? 0).toBe(shipsBefore);
    });

    it('the run deadline during a wait: the run expires, its wait is closed (expired), nothing after it runs', async () => {
      const { id } = await r.submit('wr_gated', { invoiceId: 'inv-d1', amount: 1 }, { deadline: '30m' });
      const s = await stageIn(id, 'create_case', 'awaiting_approval');
      await moveClock(31 * 60_000, async () => {
        await ended(id);
      });
      const run = (await r.store.getRun(id))!;
      expect(run.state).toBe('expired');
      expect((await waitRow(s.id))!.outcome).toBe('expired');
      expect(run.stages.map((x) => x.state)).toEqual(['cancelled', 'cancelled']);
      expect((await witness.appliedPerKey()).get('case:inv-d1')).toBeUndefined();
    });

    it('a sleep of a week by the movable clock, across a worker restart: the new worker wakes it and the run goes on', async () => {
      const { id } = await r.submit('wr_napper', {});
      const s = await stageIn(id, 'sleep', 'waiting');
      await holdsNothing(id);
      expect((await r.explain(id)).verdict).toBe('sleeping_until');
      await worker.stop();
      await moveClock(7 * 86_400_000 + 1000, async () => {
        worker = await startWorker();
        await ended(id);
      });
      const run = (await r.store.getRun(id))!;
      expect(run.state).toBe('succeeded');
      const slept = run.stages.find((x) => x.id === s.id)!.result as { sleptUntil: string };
      expect(run.result).toEqual({ ship: slept });
      expect((await waitRow(s.id))!.outcome).toBe('woken');
    });
  });
});

export type { RunView };
