import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { beginWait } from '../../src/store/signals.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startApi, until, type Api } from './helpers.js';
import { allowWaitStates, claimStage, createWaitRun, gated, hooked, waitWorkflows } from './waits-fixtures.js';

/**
 * A decision (approve, reject), a signal and a run retry lock the run, then the stage they end or revive; a finish or a
 * claim that settles the run locks its stage, then the run (a sibling's failure cancels the waiting stage too). When the two meet, PostgreSQL
 * aborts one of them (40P01). Here the other side is a session of the test that holds the waiting stage's row, waits
 * until the request waits for it, then updates the run. The request began waiting first, so its deadlock check
 * (deadlock_timeout after that) comes first and aborts it; its transaction wrote nothing, so it is asked again, and once
 * the session commits it goes through: the caller gets its answer (200), not a 503 for a deadlock. On a machine so
 * loaded that the session's update began waiting only after the request's one check, the session is the one aborted:
 * that round proves nothing, and the test tries again with a new run (3 rounds at most).
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
  const run = await createWaitRun(api.ratchet, gated, { invoiceId: 'inv-1', amount: 120 });
  const lease = await claimStage(api.ratchet.store.db, run.stageIds[0]!);
  expect((await beginWait(api.ratchet.store.db, lease, { kind: 'approval', until: { inMs: 3_600_000 } })).verdict).toBe('waiting');
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
 * One round: true when the request was the one PostgreSQL aborted (then it must have answered 200 and done its work),
 * false when the session was. `blocked` is a fragment of the request's statement that waits for the stage row.
 */
async function round(
  setup: () => Promise<{ runId: string; stageId: string }>,
  request: (runId: string, stageId: string) => Promise<Answer>,
  blocked: string,
  done: (runId: string, stageId: string, body: Record<string, unknown>) => Promise<void>,
): Promise<boolean> {
  const { runId, stageId } = await setup();
  const other = new pg.Client({ connectionString: db.url });
  await other.connect();
  let res: Promise<Answer> | null = null;
  try {
    await other.query('BEGIN');
    await other.query('SELECT id FROM ratchet.stages WHERE id = $1 FOR UPDATE', [stageId]);
    res = request(runId, stageId);
    res.catch(() => {});
    // The request has locked the run and waits for the stage row this session holds.
    // Read outside the session's transaction: inside it, pg_stat_activity would stay as it was at its first read.
    const waiting = async () =>
      (
        (await q(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND position($1 in query) > 0`,
          [blocked],
        )) as { n: number }[]
      )[0]!.n;
    await until('the request to wait for the stage row', async () => (await waiting()) > 0, 10_000);
    // Now this session asks for the run's row: a cycle.
    try {
      await other.query(`UPDATE ratchet.runs SET updated_at = now() WHERE id = $1`, [runId]);
    } catch (err) {
      if ((err as { code?: string }).code !== '40P01') throw err;
      await other.query('ROLLBACK'); // this session was the one aborted: the request goes on
      await res;
      return false;
    }
    await other.query('COMMIT');
    const out = await res;
    expect(out).toMatchObject({ status: 200 });
    await done(runId, stageId, out.body as Record<string, unknown>);
    return true;
  } finally {
    await other.end();
    await res?.catch(() => {});
  }
}

async function conclusive(one: () => Promise<boolean>): Promise<void> {
  let ok = false;
  for (let i = 0; i < 3 && !ok; i++) ok = await one();
  expect(ok, 'in 3 rounds the request was never the one PostgreSQL aborted').toBe(true);
}

const stateOf = async (table: 'runs' | 'stages', id: string) =>
  ((await q(`SELECT state FROM ratchet.${table} WHERE id = $1`, [id]))[0] as { state: string }).state;

describe('a decision, a signal or a run retry that meets a deadlock is asked again', () => {
  it('reject: the stage fails and so does the run', async () => {
    await conclusive(() =>
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
    await conclusive(() =>
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
    await conclusive(() =>
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
    await conclusive(() =>
      round(
        failedRun,
        (runId) => post(`/v1/runs/${runId}/retry`),
        `SET state = 'queued', attempt = 0`,
        async (runId, stageId, body) => {
          expect(body).toMatchObject({ previousState: 'failed', state: 'running', stage: { id: stageId } });
          expect(await stateOf('stages', stageId)).toBe('queued');
          expect(await stateOf('runs', runId)).toBe('running');
        },
      ),
    );
  });
});
