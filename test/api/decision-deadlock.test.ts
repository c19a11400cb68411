import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { beginWait } from '../../src/store/signals.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { conclusiveDeadlock, deadlockRound } from '../helpers/deadlock-round.js';
import { startApi, type Api } from './helpers.js';
import {
  allowWaitStates,
  awaitingApproval as awaitingApprovalOf,
  claimStage,
  createWaitRun,
  gated,
  hooked,
  waitWorkflows,
} from './waits-fixtures.js';

/**
 * A decision (approve, reject), a signal and a run retry lock the run, then the stage they end or revive; a finish or a
 * claim that settles the run locks its stage, then the run (a sibling's failure cancels the waiting stage too). When
 * the two meet, PostgreSQL aborts one of them (40P01); an aborted request wrote nothing and is asked again
 * (transactionAgain), so the caller gets its answer (200), not a 503. The deadlock is made on purpose by a session of
 * the test (test/helpers/deadlock-round.ts).
 */
let db: TestDatabase;
let api: Api;
beforeAll(async () => {
  db = await createTestDatabase('api_decision_deadlock');
  api = await startApi({ databaseUrl: db.url, workflows: waitWorkflows });
  await allowWaitStates(api.ratchet.store.db);
});
afterAll(async () => {
  await api?.close();
  await db?.drop();
});

type Answer = Awaited<ReturnType<Api['http']>>;
const q = (text: string, params: unknown[] = []) => api.ratchet.store.db.query(text, params);
const post = (path: string, body?: unknown) =>
  api.http(path, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });

/** A gated run whose first stage waits for a person. */
async function awaitingApproval(): Promise<{ runId: string; stageId: string }> {
  const run = await awaitingApprovalOf(api.ratchet);
  return { runId: run.id, stageId: run.stageIds[0]! };
}

/** A hooked run whose second stage waits for the signal `paid`. */
async function awaitingSignal(): Promise<{ runId: string; stageId: string }> {
  const run = await createWaitRun(api.ratchet, hooked, {});
  await q(`UPDATE ratchet.stages SET state = 'succeeded', result = '{"ok":"prep"}' WHERE id = $1`, [run.stageIds[0]]);
  const lease = await claimStage(api.ratchet.store.db, run.stageIds[1]!);
  expect((await beginWait(api.ratchet.store.db, lease, { kind: 'signal', signalName: 'paid', until: { inMs: 3_600_000 } })).verdict).toBe(
    'waiting',
  );
  return { runId: run.id, stageId: run.stageIds[1]! };
}

/** A gated run that failed at its first stage (as a rejection or an exhausted budget leaves it). */
async function failedRun(): Promise<{ runId: string; stageId: string }> {
  const run = await createWaitRun(api.ratchet, gated, { invoiceId: 'inv-2', amount: 5 });
  await q(`UPDATE ratchet.stages SET state = 'failed', error = '{"code":"tool_failed","message":"no"}', attempt = 1 WHERE id = $1`, [
    run.stageIds[0],
  ]);
  await q(`UPDATE ratchet.runs SET state = 'failed', error = '{"code":"tool_failed","message":"no"}' WHERE id = $1`, [run.id]);
  return { runId: run.id, stageId: run.stageIds[0]! };
}

/**
 * One round (test/helpers/deadlock-round.ts): true when PostgreSQL aborted the request, which then must have been asked
 * again: it answers 200 and `done` checks its work; false when it aborted the test's session.
 */
async function round(
  setup: () => Promise<{ runId: string; stageId: string }>,
  request: (runId: string, stageId: string) => Promise<Answer>,
  blocked: string,
  done: (runId: string, stageId: string, body: Record<string, unknown>) => Promise<void>,
): Promise<boolean> {
  const { runId, stageId } = await setup();
  const out = await deadlockRound({
    url: db.url,
    probe: api.ratchet.store.db,
    runId,
    stageId,
    blocked,
    request: () => request(runId, stageId),
  });
  if (out === null) return false;
  expect(out.ok ? out.value : out.err).toMatchObject({ status: 200 });
  if (out.ok) await done(runId, stageId, out.value.body as Record<string, unknown>);
  return true;
}

const stateOf = async (table: 'runs' | 'stages', id: string) =>
  ((await q(`SELECT state FROM ratchet.${table} WHERE id = $1`, [id]))[0] as { state: string }).state;

describe('a decision, a signal or a run retry that meets a deadlock is asked again', () => {
  it('reject: the stage fails and so does the run', async () => {
    await conclusiveDeadlock(() =>
      round(
        awaitingApproval,
        (runId, stageId) => post(`/v1/runs/${runId}/stages/${stageId}/reject`, { reason: 'no' }),
        `SET state = 'failed'`,
        async (runId, stageId) => {
          expect(await stateOf('stages', stageId)).toBe('failed');
          expect(await stateOf('runs', runId)).toBe('failed');
        },
      ),
    );
  });

  it('approve: the stage is queued', async () => {
    await conclusiveDeadlock(() =>
      round(
        awaitingApproval,
        (runId, stageId) => post(`/v1/runs/${runId}/stages/${stageId}/approve`, {}),
        `SET state = 'queued'`,
        async (runId, stageId) => {
          expect(await stateOf('stages', stageId)).toBe('queued');
          expect(await stateOf('runs', runId)).toBe('running');
        },
      ),
    );
  });

  it('signal: delivered to the waiting stage, once', async () => {
    await conclusiveDeadlock(() =>
      round(
        awaitingSignal,
        (runId) => post(`/v1/runs/${runId}/signals/paid`, { paid: true, ref: 'r-1' }),
        'FOR UPDATE OF w, s',
        async (runId, stageId, body) => {
          expect(body).toMatchObject({ status: 'delivered', stageId });
          expect(await stateOf('stages', stageId)).toBe('succeeded');
          const n = (await q(`SELECT count(*)::int AS n FROM ratchet.signals WHERE run_id = $1`, [runId]))[0] as { n: number };
          expect(n.n).toBe(1);
        },
      ),
    );
  });

  it('run retry: the failed stage is queued again and the run runs', async () => {
    await conclusiveDeadlock(() =>
      round(
        failedRun,
        (runId) => post(`/v1/runs/${runId}/retry`),
        // (pg_stat_activity keeps a statement's first 1 kB: a fragment near RETRY_RUN_SQL's start)
        'error, parent_run_id, parent_stage_id FROM ratchet.runs',
        async (runId, stageId, body) => {
          expect(body).toMatchObject({ previousState: 'failed', state: 'running', stage: { id: stageId } });
          expect(await stateOf('stages', stageId)).toBe('queued');
          expect(await stateOf('runs', runId)).toBe('running');
        },
      ),
    );
  });
});
