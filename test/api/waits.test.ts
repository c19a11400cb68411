import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { toolAnswer } from '../../src/agent/messages.js';
import { inputHash } from '../../src/planner/waits.js';
import { beginWait } from '../../src/store/signals.js';
import { wakeDueWaits } from '../../src/store/wake-waits.js';
import { refusalError } from '../../src/planner/waits.js';
import { toApiError } from '../../src/api/to-api-error.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { counts, startApi, TOKEN, type Api } from './helpers.js';
import {
  allowWaitStates,
  awaitingApproval as awaitingApprovalOf,
  claimStage,
  createAgentRun,
  createWaitRun,
  gated,
  hooked,
  napper,
  waitWorkflows,
} from './waits-fixtures.js';

/**
 * Waits through the real server and client on PostgreSQL (issue 10): signals, approval
 * decisions, their races and timeouts by the movable database clock. No worker here: each test
 * plays the claim's part (claimStage + beginWait), as the executor does (the same flows through a
 * real worker: test/worker/waits-run.test.ts).
 */
let db: TestDatabase;
let api: Api;
beforeAll(async () => {
  db = await createTestDatabase('api_waits');
  api = await startApi({ databaseUrl: db.url, poolSize: 24, workflows: waitWorkflows });
  await allowWaitStates(api.ratchet.store.db);
});
afterAll(async () => {
  await api?.close();
  await db?.drop();
});

const q = (text: string, params: unknown[] = []) => api.ratchet.store.db.query(text, params);
const stageRow = async (id: string) =>
  (await q(`SELECT state, input, result, error, max_attempts, attempt FROM ratchet.stages WHERE id = $1`, [id]))[0]!;
const runRow = async (id: string) => (await q(`SELECT state, error, result FROM ratchet.runs WHERE id = $1`, [id]))[0]!;
const eventsOf = async (runId: string, type: string) =>
  (await q(`SELECT stage_id::text, data FROM ratchet.events WHERE run_id = $1 AND type = $2 ORDER BY id`, [runId, type])) as {
    stage_id: string;
    data: Record<string, unknown>;
  }[];

const awaitingApproval = (input?: { invoiceId: string; amount: number }) => awaitingApprovalOf(api.ratchet, input);

describe('approval gates', () => {
  it('the stage waits holding nothing; approve (edited input checked by the schema) queues it with the edit; who, when and the hash in the events', async () => {
    const run = await awaitingApproval();
    const s0 = run.stageIds[0]!;
    expect(await stageRow(s0)).toMatchObject({ state: 'awaiting_approval', max_attempts: 4 }); // 1 + 3: the claim that ends the wait has the whole budget
    const [lease] = await q(`SELECT owner_id, lease_until, heartbeat_at FROM ratchet.stages WHERE id = $1`, [s0]);
    expect(lease).toEqual({ owner_id: null, lease_until: null, heartbeat_at: null });
    expect((await api.client.explain(run.id)).verdict).toBe('awaiting_approval');
    const listed = await api.client.approvals();
    expect(listed.approvals.map((a) => a.stageId)).toContain(s0);
    expect(listed.approvals.find((a) => a.stageId === s0)).toMatchObject({
      runId: run.id,
      tool: 'create_case',
      input: { invoiceId: 'inv-1', amount: 120 },
    });

    // An edited input the tool's schema refuses: 422 with the path, nothing changed.
    const before = await counts(api.ratchet);
    const bad = await api.http(`/v1/runs/${run.id}/stages/${s0}/approve`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ input: { invoiceId: 'inv-1', amount: -5 } }),
    });
    expect(bad.status).toBe(422);
    expect(bad.body.error).toMatchObject({ code: 'invalid_input', path: 'input.amount' });
    expect(await counts(api.ratchet)).toEqual(before);
    expect((await stageRow(s0)).state).toBe('awaiting_approval');

    const edited = { invoiceId: 'inv-1', amount: 100 };
    const d = await api.client.approve(run.id, { stageId: s0, input: edited, reason: 'capped at 100', by: 'Ana' });
    expect(d).toMatchObject({
      runId: run.id,
      stageId: s0,
      decision: 'approved',
      actor: 'Ana',
      reason: 'capped at 100',
      inputHash: inputHash(edited),
      runEnded: null,
    });
    expect(d.decidedBy).toMatch(/^token:[0-9a-f]{12}$/);
    expect(await stageRow(s0)).toMatchObject({ state: 'queued', input: edited });
    const [ev] = await eventsOf(run.id, 'approval_granted');
    expect(ev!.data).toEqual({ decidedBy: d.decidedBy, actor: 'Ana', reason: 'capped at 100', edited: true, inputHash: inputHash(edited) });
    // A second decision: 409 already_decided naming the first.
    const again = await api.http(`/v1/runs/${run.id}/stages/${s0}/reject`, { method: 'POST' });
    expect(again.status).toBe(409);
    expect(again.body.error).toMatchObject({ code: 'already_decided', details: { outcome: 'approved', decidedBy: d.decidedBy } });
  });

  it('20 concurrent approve / reject calls on one stage: exactly one decision, 19 × 409 already_decided', async () => {
    const run = await awaitingApproval({ invoiceId: 'inv-race', amount: 7 });
    const s0 = run.stageIds[0]!;
    const answers = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        api.http(`/v1/runs/${run.id}/stages/${s0}/${i % 2 === 0 ? 'approve' : 'reject'}`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ reason: `caller ${i}` }),
        }),
      ),
    );
    const statuses = answers.map((a) => a.status).sort();
    expect(statuses.filter((s) => s === 200)).toHaveLength(1);
    expect(statuses.filter((s) => s === 409)).toHaveLength(19);
    expect(answers.filter((a) => a.status === 409).every((a) => a.body.error.code === 'already_decided')).toBe(true);
    const decided = (await eventsOf(run.id, 'approval_granted')).length + (await eventsOf(run.id, 'approval_rejected')).length;
    expect(decided).toBe(1);
    const [w] = await q(`SELECT outcome FROM ratchet.waits WHERE stage_id = $1`, [s0]);
    const winner = answers.find((a) => a.status === 200)!.body;
    expect(w!.outcome).toBe(winner.decision);
  });

  it('reject in a static run: the stage fails approval_rejected, the run fails with it, the rest is cancelled; nothing ran', async () => {
    const run = await awaitingApproval({ invoiceId: 'inv-no', amount: 9 });
    const d = await api.client.reject(run.id, { reason: 'not ours', by: 'Bo' }); // no --stage: the run's one stage awaiting approval
    expect(d).toMatchObject({ decision: 'rejected', stageId: run.stageIds[0], runEnded: 'failed', reason: 'not ours' });
    expect(await stageRow(run.stageIds[0]!)).toMatchObject({
      state: 'failed',
      error: { code: 'approval_rejected', details: { reason: 'not ours' } },
    });
    expect(await runRow(run.id)).toMatchObject({ state: 'failed', error: { code: 'approval_rejected' } });
    expect((await stageRow(run.stageIds[1]!)).state).toBe('cancelled');
    const e = await api.client.explain(run.id);
    expect(e).toMatchObject({ verdict: 'terminal', runState: 'failed' });
    expect(e.summary).toMatch(/approval_rejected/);
  });

  it("reject in an agent run: the call fails with the rejection as the tool's answer, the next model call is queued, the run goes on", async () => {
    const run = await createAgentRun(api.ratchet, { invoiceId: 'inv-a', amount: 50 });
    const lease = await claimStage(api.ratchet.store.db, run.stageIds[1]!);
    await beginWait(api.ratchet.store.db, lease, { kind: 'approval', until: null });
    const d = await api.client.reject(run.id, { stageId: run.stageIds[1]!, reason: 'duplicate invoice' });
    expect(d.runEnded).toBeNull();
    const call = await stageRow(run.stageIds[1]!);
    expect(call).toMatchObject({ state: 'failed', error: { code: 'approval_rejected' } });
    expect(JSON.parse(toolAnswer({ state: 'failed', result: null, error: call.error }))).toEqual({
      error: 'approval_rejected',
      message: 'a person rejected this call; the tool did not run',
      reason: 'duplicate invoice',
      decidedBy: d.decidedBy,
    });
    expect((await stageRow(run.stageIds[2]!)).state).toBe('queued');
    expect((await runRow(run.id)).state).toBe('running');
  });

  it('the approval times out by the movable database clock: approval_timeout, the run fails; a late decision is 409 already_decided', async () => {
    const run = await awaitingApproval({ invoiceId: 'inv-late', amount: 3 });
    const s0 = run.stageIds[0]!;
    const refuse = (due: { tool: string; since: Date; until: Date }) => ({
      error: refusalError(due.tool, { outcome: 'timed_out', decidedBy: null, decidedAt: due.until, reason: null }, 3_600_000),
      asValue: false,
    });
    expect((await wakeDueWaits(api.ratchet.store.db, 100, refuse)).timedOut).not.toContain(s0);
    await api.ratchet.store.clock.advance(3_600_000 + 1000);
    try {
      const woke = await wakeDueWaits(api.ratchet.store.db, 100, refuse);
      expect(woke.timedOut).toContain(s0);
    } finally {
      await api.ratchet.store.clock.setOffset(0);
    }
    expect(await stageRow(s0)).toMatchObject({ state: 'failed', error: { code: 'approval_timeout' } });
    expect((await runRow(run.id)).state).toBe('failed');
    const late = await api.http(`/v1/runs/${run.id}/stages/${s0}/approve`, { method: 'POST' });
    expect(late.status).toBe(409);
    expect(late.body.error).toMatchObject({ code: 'already_decided', details: { outcome: 'timed_out' } });
  });

  it('an approval left open on a run that ended (a sibling failed it) is not listed: GET /v1/approvals shows only active runs', async () => {
    const run = await awaitingApproval({ invoiceId: 'inv-ended', amount: 4 });
    const s0 = run.stageIds[0]!;
    expect((await api.client.approvals()).approvals.map((a) => a.stageId)).toContain(s0);
    // what a group failure elsewhere in the run leaves behind: the run failed, the untimed approval row still open
    await q(`UPDATE ratchet.runs SET state = 'failed', finished_at = now() WHERE id = $1`, [run.id]);
    expect((await api.client.approvals()).approvals.map((a) => a.stageId)).not.toContain(s0);
    const one = await api.http(`/v1/approvals?runId=${run.id}`);
    expect(one.status).toBe(200);
    expect(one.body.approvals).toEqual([]);
  });

  it('an approved call that then failed for good, its run retried: it runs again without asking, and an approval_reused event says whose approval stands', async () => {
    const run = await awaitingApproval({ invoiceId: 'inv-reuse', amount: 6 });
    const s0 = run.stageIds[0]!;
    const ok = await api.http(`/v1/runs/${run.id}/stages/${s0}/approve`, {
      method: 'POST',
      body: JSON.stringify({ by: 'Ana' }),
      headers: { 'content-type': 'application/json' },
    });
    expect(ok.status).toBe(200);
    await q(`UPDATE ratchet.stages SET state = 'failed', error = '{"code":"tool_failed","message":"x"}' WHERE id = $1`, [s0]);
    await q(`UPDATE ratchet.stages SET state = 'cancelled' WHERE id = $1`, [run.stageIds[1]]);
    await q(`UPDATE ratchet.runs SET state = 'failed', error = '{"code":"tool_failed"}' WHERE id = $1`, [run.id]);
    await api.client.retry(run.id);
    expect((await stageRow(s0)).state).toBe('queued');
    const reused = await eventsOf(run.id, 'approval_reused');
    expect(reused).toHaveLength(1);
    expect(reused[0]).toMatchObject({ stage_id: s0, data: { actor: 'Ana', inputHash: null } });
    expect(typeof reused[0]!.data.decidedBy).toBe('string');
  });

  it('bad input on every approval route: a typed 4xx, nothing written', async () => {
    const run = await awaitingApproval({ invoiceId: 'inv-bad', amount: 1 });
    const s0 = run.stageIds[0]!;
    const before = await counts(api.ratchet);
    const post = (path: string, body?: string, headers: Record<string, string> = { 'content-type': 'application/json' }) =>
      api.http(path, { method: 'POST', headers, ...(body !== undefined ? { body } : {}) });
    const cases: [Promise<{ status: number; body: any }>, number, string][] = [
      [post(`/v1/runs/${run.id}/stages/abc/approve`), 400, 'invalid_request'],
      [post(`/v1/runs/${run.id}/stages/${s0}/approve`, '{not json'), 400, 'invalid_json'],
      [post(`/v1/runs/${run.id}/stages/${s0}/approve`, JSON.stringify({ inptu: {} })), 400, 'invalid_request'],
      [post(`/v1/runs/${run.id}/stages/${s0}/reject`, JSON.stringify({ reason: '' })), 400, 'invalid_request'],
      [post(`/v1/runs/${run.id}/stages/${s0}/reject`, JSON.stringify({ reason: 'x'.repeat(2001) })), 400, 'invalid_request'],
      [post(`/v1/runs/00000000-0000-0000-0000-000000000000/stages/${s0}/approve`), 404, 'unknown_run'],
      [post(`/v1/runs/not-a-uuid/stages/${s0}/approve`), 404, 'unknown_run'],
      [post(`/v1/runs/${run.id}/stages/999999999/approve`), 404, 'unknown_stage'],
      [post(`/v1/runs/${run.id}/stages/${run.stageIds[1]}/approve`), 409, 'not_awaiting_approval'], // ship: no gate
      [api.http(`/v1/runs/${run.id}/stages/${s0}/approve`, { method: 'POST', token: 'wrong' }), 401, 'unauthorized'],
      [api.http(`/v1/approvals?limit=0`), 400, 'invalid_request'],
    ];
    for (const [p, status, code] of cases) {
      const r = await p;
      expect([r.status, r.body.error?.code]).toEqual([status, code]);
    }
    expect(await counts(api.ratchet)).toEqual(before);
    expect((await stageRow(s0)).state).toBe('awaiting_approval');
  });

  it('a lone surrogate in reason or by is 400 invalid_request at its path (PostgreSQL cannot store it), nothing written', async () => {
    const run = await awaitingApproval({ invoiceId: 'inv-surrogate', amount: 1 });
    const s0 = run.stageIds[0]!;
    const before = await counts(api.ratchet);
    const post = (decision: 'approve' | 'reject', body: string) =>
      api.http(`/v1/runs/${run.id}/stages/${s0}/${decision}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    const cases: [ReturnType<typeof post>, string][] = [
      [post('reject', '{"reason":"no \\udfff"}'), 'reason'],
      [post('reject', '{"by":"\\ud800"}'), 'by'],
      [post('approve', '{"by":"\\ud800"}'), 'by'],
      [post('approve', '{"reason":"ok","by":"Ana \\ud83d"}'), 'by'],
      [post('approve', '{"reason":"\\ude00\\ud83d"}'), 'reason'],
    ];
    for (const [p, path] of cases) {
      const r = await p;
      expect([r.status, r.body.error?.code, r.body.error?.path]).toEqual([400, 'invalid_request', path]);
    }
    expect(await counts(api.ratchet)).toEqual(before);
    expect((await stageRow(s0)).state).toBe('awaiting_approval');
    // A surrogate pair is Unicode text: accepted as before.
    const ok = await post('reject', '{"reason":"no \\ud83d\\ude00","by":"Ana"}');
    expect([ok.status, ok.body.reason]).toEqual([200, 'no \u{1f600}']);
  });
});

describe('approve / reject from the dashboard', () => {
  it('a reason the API refuses (U+0000, past 2,000 characters) is a 4xx there too, nothing decided; a long one is kept whole', async () => {
    const cookie = `ratchet_token=${TOKEN}`;
    const run = await awaitingApproval({ invoiceId: 'dash-1', amount: 130 });
    const s0 = run.stageIds[0]!;
    const page = await (await fetch(`${api.server.url}/runs/${run.id}`, { headers: { cookie, accept: 'text/html' } })).text();
    const csrf = /name="csrf-token" content="([^"]+)"/.exec(page)![1]!;
    const reject = (reason: string) =>
      fetch(`${api.server.url}/runs/${run.id}/stages/${s0}/reject`, {
        method: 'POST',
        headers: { accept: 'application/json', cookie, 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ csrf, reason }),
      });
    const before = await counts(api.ratchet);
    for (const reason of ['no\u0000', 'x'.repeat(2001)]) {
      const res = await reject(reason);
      expect(res.status, reason.slice(0, 10)).toBeGreaterThanOrEqual(400);
      expect(res.status, reason.slice(0, 10)).toBeLessThan(500);
      expect(((await res.json()) as { error: { path?: string } }).error.path).toBe('reason');
    }
    expect(await counts(api.ratchet)).toEqual(before);
    expect((await stageRow(s0)).state).toBe('awaiting_approval');
    const long = `${'y'.repeat(498)}😀 and the rest`; // cut at 500 it was a lone surrogate
    const ok = await reject(long);
    expect(ok.status).toBe(200);
    expect(((await ok.json()) as { reason: string }).reason).toBe(long);
  });
});

describe('metrics', () => {
  it('ratchet_waiting_stages{kind} counts the stages that wait without a lease, by the database', async () => {
    const [c] = await q(
      `SELECT count(*) FILTER (WHERE w.kind = 'approval')::int AS approval, count(*) FILTER (WHERE w.kind = 'signal')::int AS signal
       FROM ratchet.waits w JOIN ratchet.stages s ON s.id = w.stage_id WHERE w.ended_at IS NULL AND s.state IN ('waiting', 'awaiting_approval')`,
    );
    await awaitingApproval({ invoiceId: 'inv-metric', amount: 1 });
    const text = (await api.http('/v1/metrics')).body as string;
    expect(text).toContain(`ratchet_waiting_stages{kind="approval"} ${(c!.approval as number) + 1}`);
    expect(text).toContain(`ratchet_waiting_stages{kind="signal"} ${c!.signal}`);
    expect(text).toContain('ratchet_waiting_stages{kind="sleep"}');
  });
});

describe('cancel and deadlines on waiting runs', () => {
  it('cancel while a stage awaits approval: the stage is cancelled, nothing after it queued; a decision then is 409, a signal 409, nothing written', async () => {
    const run = await awaitingApproval({ invoiceId: 'inv-cancel', amount: 2 });
    const c = await api.client.cancel(run.id);
    expect(c).toMatchObject({ cancelled: true, previousState: 'running', runningStageIds: [] }); // nothing was leased
    expect(run.stageIds.length).toBe(2);
    expect((await stageRow(run.stageIds[0]!)).state).toBe('cancelled');
    expect((await stageRow(run.stageIds[1]!)).state).toBe('cancelled');
    const before = await counts(api.ratchet);
    const late = await api.http(`/v1/runs/${run.id}/stages/${run.stageIds[0]}/approve`, { method: 'POST' });
    expect([late.status, late.body.error.code]).toEqual([409, 'not_awaiting_approval']);
    expect(await counts(api.ratchet)).toEqual(before);
    // The cancel closed the wait in its own statement (outcome cancelled, a wait_ended event); the decision rolled back.
    const [w] = await q(`SELECT ended_at, outcome FROM ratchet.waits WHERE stage_id = $1`, [run.stageIds[0]]);
    expect(w!.outcome).toBe('cancelled');
    expect(w!.ended_at).not.toBeNull();
    expect((await eventsOf(run.id, 'wait_ended')).map((e) => e.data)).toEqual([{ kind: 'approval', outcome: 'cancelled' }]);
  });

  it('a run deadline passing while it waits for a signal: the run expires, its waiting stage is cancelled (by the movable clock)', async () => {
    const run = await createWaitRun(api.ratchet, hooked, {});
    await q(`UPDATE ratchet.runs SET deadline = ratchet.db_now() + interval '30 minutes' WHERE id = $1`, [run.id]);
    await q(`UPDATE ratchet.stages SET state = 'succeeded' WHERE id = $1`, [run.stageIds[0]]);
    const lease = await claimStage(api.ratchet.store.db, run.stageIds[1]!);
    await beginWait(api.ratchet.store.db, lease, { kind: 'signal', signalName: 'paid', until: { inMs: 3_600_000 } });
    await api.ratchet.store.clock.advance(31 * 60_000);
    try {
      await api.ratchet.store.expireRuns(100);
    } finally {
      await api.ratchet.store.clock.setOffset(0);
    }
    expect((await runRow(run.id)).state).toBe('expired');
    expect((await stageRow(run.stageIds[1]!)).state).toBe('cancelled');
    const [w] = await q(`SELECT outcome FROM ratchet.waits WHERE stage_id = $1`, [run.stageIds[1]]);
    expect(w!.outcome).toBe('expired'); // closed in the expiry's own statement
  });
});

describe('signals', () => {
  /** A hooked run whose prep stage succeeded: its signal stage is queued (the claim will start the wait). */
  async function atTheWait() {
    const run = await createWaitRun(api.ratchet, hooked, {});
    await q(`UPDATE ratchet.stages SET state = 'succeeded', result = '{"ok":"prep"}' WHERE id = $1`, [run.stageIds[0]]);
    await q(`UPDATE ratchet.stages SET state = 'queued' WHERE id = $1`, [run.stageIds[1]]);
    await q(`UPDATE ratchet.runs SET state = 'running' WHERE id = $1`, [run.id]);
    return run;
  }
  const send = (runId: string, name: string, body: unknown, signalId?: string) =>
    api.http(`/v1/runs/${runId}/signals/${name}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(signalId ? { 'signal-id': signalId } : {}) },
      body: JSON.stringify(body),
    });

  it('sent before the wait: kept (202), consumed once when the wait starts (the payload is the output, what follows is queued); the same Signal-Id again: one delivery', async () => {
    const run = await atTheWait();
    const kept = await send(run.id, 'paid', { paid: true, ref: 'r-1' }, 'sig-1');
    expect(kept.status).toBe(202);
    expect(kept.body).toMatchObject({ status: 'kept', duplicate: false, stageId: null, signalId: 'sig-1' });
    const twice = await send(run.id, 'paid', { paid: true, ref: 'r-1' }, 'sig-1');
    expect([twice.status, twice.body.duplicate, twice.body.status]).toEqual([200, true, 'kept']);
    const conflict = await send(run.id, 'paid', { paid: false, ref: 'r-1' }, 'sig-1');
    expect([conflict.status, conflict.body.error.code]).toEqual([409, 'signal_id_conflict']);

    const lease = await claimStage(api.ratchet.store.db, run.stageIds[1]!);
    const w = await beginWait(api.ratchet.store.db, lease, { kind: 'signal', signalName: 'paid', until: { inMs: 3_600_000 } });
    expect(w).toMatchObject({ verdict: 'consumed', signalId: 'sig-1' });
    expect(await stageRow(run.stageIds[1]!)).toMatchObject({ state: 'succeeded', result: { paid: true, ref: 'r-1' } });
    expect((await stageRow(run.stageIds[2]!)).state).toBe('queued');
    const [sig] = await q(`SELECT count(*)::int AS n, count(consumed_at)::int AS consumed FROM ratchet.signals WHERE run_id = $1`, [
      run.id,
    ]);
    expect(sig).toEqual({ n: 1, consumed: 1 });
    const after = await send(run.id, 'paid', { paid: true, ref: 'r-1' }, 'sig-1');
    expect([after.status, after.body.duplicate, after.body.status, after.body.stageId]).toEqual([200, true, 'delivered', run.stageIds[1]]);
    expect((await eventsOf(run.id, 'signal_received')).length).toBe(1);
  });

  it('sent to the waiting stage: delivered (200), the stage succeeds with the payload in the same transaction that queues what follows', async () => {
    const run = await atTheWait();
    const lease = await claimStage(api.ratchet.store.db, run.stageIds[1]!);
    expect((await beginWait(api.ratchet.store.db, lease, { kind: 'signal', signalName: 'paid', until: { inMs: 3_600_000 } })).verdict).toBe(
      'waiting',
    );
    const e = await api.client.explain(run.id);
    expect(e).toMatchObject({ verdict: 'waiting_for_signal', evidence: { signal: 'paid', timeoutMs: 3_600_000, onTimeout: 'fail' } });
    const d = await api.client.signal(run.id, 'paid', { paid: true, ref: 'r-2' }, { signalId: 'sig-2' });
    expect(d).toMatchObject({ status: 'delivered', stageId: run.stageIds[1], duplicate: false });
    expect(await stageRow(run.stageIds[1]!)).toMatchObject({ state: 'succeeded', result: { paid: true, ref: 'r-2' } });
    expect((await stageRow(run.stageIds[2]!)).state).toBe('queued');
  });

  it('a signal and the start of its wait racing, 30 times: delivered exactly once every time', async () => {
    for (let i = 0; i < 30; i++) {
      const run = await atTheWait();
      const lease = await claimStage(api.ratchet.store.db, run.stageIds[1]!);
      const [sent, began] = await Promise.all([
        api.client.signal(run.id, 'paid', { paid: true, ref: `race-${i}` }),
        beginWait(api.ratchet.store.db, lease, { kind: 'signal', signalName: 'paid', until: { inMs: 3_600_000 } }),
      ]);
      expect(sent.status === 'delivered' ? began.verdict === 'waiting' : began.verdict === 'consumed').toBe(true);
      expect(await stageRow(run.stageIds[1]!)).toMatchObject({ state: 'succeeded', result: { paid: true, ref: `race-${i}` } });
      const [n] = await q(`SELECT count(*)::int AS n FROM ratchet.signals WHERE run_id = $1 AND consumed_at IS NOT NULL`, [run.id]);
      expect(n!.n).toBe(1);
    }
  });

  it('the timeout by the movable clock: the stage is queued again (its claim fails signal_timeout or takes onTimeout); a late signal is 409 already_decided', async () => {
    const run = await atTheWait();
    const lease = await claimStage(api.ratchet.store.db, run.stageIds[1]!);
    await beginWait(api.ratchet.store.db, lease, { kind: 'signal', signalName: 'paid', until: { inMs: 3_600_000 } });
    const none = () => null;
    expect((await wakeDueWaits(api.ratchet.store.db, 100, none)).woken.map((w) => w.id)).not.toContain(run.stageIds[1]);
    await api.ratchet.store.clock.advance(3_600_000);
    try {
      const woke = await wakeDueWaits(api.ratchet.store.db, 100, none);
      expect(woke.woken).toContainEqual(expect.objectContaining({ id: run.stageIds[1], kind: 'signal', attempt: 2 }));
    } finally {
      await api.ratchet.store.clock.setOffset(0);
    }
    expect((await stageRow(run.stageIds[1]!)).state).toBe('queued');
    const [w] = await q(`SELECT outcome FROM ratchet.waits WHERE stage_id = $1`, [run.stageIds[1]]);
    expect(w!.outcome).toBe('timed_out');
    const late = await send(run.id, 'paid', { paid: true, ref: 'late' });
    expect([late.status, late.body.error.code]).toEqual([409, 'already_decided']);
  });

  /** A run whose signal wait timed out and failed it (signal_timeout), then retried: its signal stage is queued again. */
  async function retriedAfterSignalTimeout() {
    const run = await atTheWait();
    const s1 = run.stageIds[1]!;
    const lease = await claimStage(api.ratchet.store.db, s1);
    await beginWait(api.ratchet.store.db, lease, { kind: 'signal', signalName: 'paid', until: { inMs: 60_000 } });
    await api.ratchet.store.clock.advance(61_000);
    try {
      await wakeDueWaits(api.ratchet.store.db, 100, () => null);
    } finally {
      await api.ratchet.store.clock.setOffset(0);
    }
    // the claim after the timeout fails the stage signal_timeout (decideSignalStep), the run with it
    await q(`UPDATE ratchet.stages SET state = 'failed', error = '{"code":"signal_timeout","message":"timed out"}' WHERE id = $1`, [s1]);
    await q(`UPDATE ratchet.stages SET state = 'cancelled' WHERE id = $1`, [run.stageIds[2]]);
    await q(`UPDATE ratchet.runs SET state = 'failed', error = '{"code":"signal_timeout"}' WHERE id = $1`, [run.id]);
    await api.client.retry(run.id);
    expect((await stageRow(s1)).state).toBe('queued');
    return { run, s1 };
  }

  it('a run failed by signal_timeout and retried: a signal sent before the retried stage waits again is kept (202) and consumed by the new wait', async () => {
    const { run, s1 } = await retriedAfterSignalTimeout();
    const kept = await send(run.id, 'paid', { paid: true, ref: 'after-retry' }, 'sig-retry');
    expect([kept.status, kept.body.status]).toEqual([202, 'kept']);
    const again = await claimStage(api.ratchet.store.db, s1);
    const w = await beginWait(api.ratchet.store.db, again, { kind: 'signal', signalName: 'paid', until: { inMs: 60_000 } });
    expect(w).toMatchObject({ verdict: 'consumed', signalId: 'sig-retry' });
    expect(await stageRow(s1)).toMatchObject({ state: 'succeeded', result: { paid: true, ref: 'after-retry' } });
  });

  it('the same, the signal sent once the retried stage is claimed but before its new wait begins: kept (202), not 409, and consumed', async () => {
    const { run, s1 } = await retriedAfterSignalTimeout();
    const again = await claimStage(api.ratchet.store.db, s1);
    expect((await stageRow(s1)).state).toBe('running');
    const kept = await send(run.id, 'paid', { paid: true, ref: 'while-claimed' }, 'sig-claimed');
    expect([kept.status, kept.body.status]).toEqual([202, 'kept']);
    const w = await beginWait(api.ratchet.store.db, again, { kind: 'signal', signalName: 'paid', until: { inMs: 60_000 } });
    expect(w).toMatchObject({ verdict: 'consumed', signalId: 'sig-claimed' });
    expect(await stageRow(s1)).toMatchObject({ state: 'succeeded', result: { paid: true, ref: 'while-claimed' } });
  });

  it('lock order: the sweeper takes the run row first (as a decision and cancel do): a run locked elsewhere is skipped, not half-locked', async () => {
    const run = await atTheWait();
    const s1 = run.stageIds[1]!;
    const lease = await claimStage(api.ratchet.store.db, s1);
    await beginWait(api.ratchet.store.db, lease, { kind: 'signal', signalName: 'paid', until: { inMs: 60_000 } });
    await api.ratchet.store.clock.advance(61_000);
    try {
      await api.ratchet.store.db.transaction(async (tx) => {
        // a decision or a cancel of this run holds its row (lockRun / CANCEL_RUN_SQL take the run first)
        await tx.query(`SELECT 1 FROM ratchet.runs WHERE id = $1::uuid FOR UPDATE`, [run.id]);
        const woke = await wakeDueWaits(api.ratchet.store.db, 100, () => null);
        expect(woke.woken.map((w) => w.id)).not.toContain(s1);
        const [w] = await q(`SELECT ended_at FROM ratchet.waits WHERE stage_id = $1`, [s1]);
        expect(w!.ended_at).toBeNull();
      });
      const woke = await wakeDueWaits(api.ratchet.store.db, 100, () => null);
      expect(woke.woken.map((w) => w.id)).toContain(s1);
    } finally {
      await api.ratchet.store.clock.setOffset(0);
    }
  });

  it('a database conflict (deadlock 40P01, serialisation 40001) is a retryable 503 transaction_conflict, not a 500 internal', () => {
    for (const code of ['40P01', '40001']) {
      const err = Object.assign(new Error('deadlock detected'), { code });
      const e = toApiError(err, 1);
      expect([e.status, e.code, e.retryAfterMs]).toEqual([503, 'transaction_conflict', 1000]);
    }
    expect(toApiError(Object.assign(new Error('x'), { code: '42P01' }), 1).code).toBe('internal');
  });

  it('approvals this process cannot decide (definition not loaded) do not fill a small batch: the sleep behind them is woken', async () => {
    await awaitingApproval({ invoiceId: 'inv-starve-1', amount: 1 });
    await awaitingApproval({ invoiceId: 'inv-starve-2', amount: 1 });
    const run = await createWaitRun(api.ratchet, napper, {});
    const lease = await claimStage(api.ratchet.store.db, run.stageIds[0]!);
    await beginWait(api.ratchet.store.db, lease, { kind: 'sleep', until: { inMs: 2 * 3_600_000 } });
    await api.ratchet.store.clock.advance(2 * 3_600_000 + 1000);
    const woken: string[] = [];
    try {
      for (let i = 0; i < 20; i++) {
        const r = await wakeDueWaits(api.ratchet.store.db, 2, () => null, ['a-definition-this-process-lacks']);
        woken.push(...r.woken.map((x) => x.id));
        if (r.seen < 2) break;
      }
    } finally {
      await api.ratchet.store.clock.setOffset(0);
    }
    expect(woken).toContain(run.stageIds[0]);
  });

  it('a sleep: waiting until its time by the database clock (explain sleeping_until), then queued for the claim that ends it', async () => {
    const run = await createWaitRun(api.ratchet, napper, {});
    const lease = await claimStage(api.ratchet.store.db, run.stageIds[0]!);
    const w = await beginWait(api.ratchet.store.db, lease, { kind: 'sleep', until: { inMs: 600_000 } });
    expect(w.verdict).toBe('waiting');
    const e = await api.client.explain(run.id);
    expect(e.verdict).toBe('sleeping_until');
    if (e.verdict !== 'sleeping_until') return;
    expect(Date.parse(e.evidence.until) - Date.parse(e.evidence.since)).toBe(600_000); // by the database clock, from the wait's start
    expect(e.evidence.remainingMs).toBeGreaterThan(0);
    await api.ratchet.store.clock.advance(600_000);
    try {
      expect((await wakeDueWaits(api.ratchet.store.db, 100, () => null)).woken.map((x) => x.id)).toContain(run.stageIds[0]);
    } finally {
      await api.ratchet.store.clock.setOffset(0);
    }
    expect((await stageRow(run.stageIds[0]!)).state).toBe('queued');
  });

  it('bad input: unknown name 404, bad payload 422 with its path, a finished run 409, bad Signal-Id 400, not JSON 400; nothing written', async () => {
    const run = await atTheWait();
    const done = await atTheWait();
    await q(`UPDATE ratchet.runs SET state = 'succeeded' WHERE id = $1`, [done.id]);
    const before = await counts(api.ratchet);
    const [signals] = await q(`SELECT count(*)::int AS n FROM ratchet.signals`);
    const cases: [Promise<{ status: number; body: any }>, number, string, string?][] = [
      [send(run.id, 'refund', { paid: true, ref: 'x' }), 404, 'unknown_signal', 'name'],
      [send(run.id, 'paid', { paid: 'yes', ref: 'x' }), 422, 'invalid_input', 'payload.paid'],
      [send(run.id, 'paid', null), 422, 'invalid_input', 'payload'],
      [send(done.id, 'paid', { paid: true, ref: 'x' }), 409, 'already_terminal'],
      [send('00000000-0000-0000-0000-000000000000', 'paid', {}), 404, 'unknown_run'],
      [send(run.id, 'paid', { paid: true, ref: 'x' }, 'x'.repeat(256)), 400, 'invalid_request', 'Signal-Id'],
      [
        api.http(`/v1/runs/${run.id}/signals/paid`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{' }),
        400,
        'invalid_json',
      ],
      [api.http(`/v1/runs/${run.id}/signals/paid`, { method: 'POST', body: JSON.stringify({}), token: null }), 401, 'unauthorized'],
    ];
    for (const [p, status, code, path] of cases) {
      const r = await p;
      expect([r.status, r.body.error?.code]).toEqual([status, code]);
      if (path) expect(r.body.error.path).toBe(path);
    }
    expect(await counts(api.ratchet)).toEqual(before);
    expect((await q(`SELECT count(*)::int AS n FROM ratchet.signals`))[0]).toEqual(signals);
  });
});
