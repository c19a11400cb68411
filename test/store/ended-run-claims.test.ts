import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EXPIRE_RUNS_SQL } from '../../src/store/deadline.sql.js';
import { expireRuns } from '../../src/store/deadline.js';
import { openStore, type Store } from '../../src/store/index.js';
import { cancelRun } from '../../src/store/runs.js';
import { failingOnce } from '../helpers/failing-db.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { spec } from './lease-suite.js';

/**
 * Issue 9, item 7 (review finding 4): a finish that inserts an agent's plan while the expiry (or
 * a cancel) ends the run commits queued stages that statement's snapshot never saw. Reproduced
 * here by committing a queued stage into a run the expiry already expired (and one a cancel
 * already cancelled): no claim of any kind takes it, and the statement that cancels the leftovers
 * of ended runs (run by the expiry and the cancel right after them) cancels it with an event.
 * Also: the expiry reads runs_active_deadline_idx (finding 5).
 */
describe('stages of ended runs are never claimed (PostgreSQL)', () => {
  let db: TestDatabase;
  let store: Store;
  let n = 0;
  beforeAll(async () => {
    db = await createTestDatabase('ended_run_claims');
    store = await openStore({ databaseUrl: db.url });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });

  /** What a finish's `planned` CTE writes, committed after the run ended. */
  const lateQueued = async (runId: string, toolClass: string, concurrencyKey?: string) => {
    await db.query(
      `
      INSERT INTO ratchet.stages (run_id, definition_hash, seq, name, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms,
        max_attempts, idempotency_key, concurrency_key, concurrency_limit, input, available_at)
      SELECT $1::uuid, 'h', 2, 'late', 'late', $2, 'queued', 3000, 3000, 60000, 3, $1::text || ':2:late', $3::text,
        CASE WHEN $3::text IS NULL THEN NULL ELSE 5 END, '{}'::jsonb, ratchet.db_now() - interval '1 second'`,
      [runId, toolClass, concurrencyKey ?? null],
    );
    return (await db.query<{ id: string }>(`SELECT id::text AS id FROM ratchet.stages WHERE run_id = $1 AND seq = 2`, [runId]))[0]!.id;
  };
  const stateOf = async (id: string) =>
    (await db.query<{ state: string }>(`SELECT state FROM ratchet.stages WHERE id = $1`, [id]))[0]!.state;
  const claimsNothing = async (c: string) => {
    expect(await store.claim({ owner: 'A', toolClass: c, limit: 10, definitions: ['h'] })).toEqual([]);
    expect(await store.claim({ owner: 'A', toolClass: c, limit: 10, definitions: ['h'], limits: { classConcurrency: 10 } })).toEqual([]);
    expect(await store.claim({ owner: 'A', toolClass: c, limit: 10, definitions: ['h'], limits: { keyed: true } })).toEqual([]);
  };

  it('a queued stage committed into an expired run is claimed by no claim, then cancelled as a leftover (by the expiry, or by a cancel asked of the expired run)', async () => {
    for (const key of [undefined, 'tenant']) {
      const c = `ended_${++n}`;
      const run = await store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: {},
        deadlineInMs: 1000,
        stages: [spec({ toolClass: c, ...(key ? { concurrencyKey: key, concurrencyLimit: 5 } : {}) })],
      });
      const [first] = await store.claim({
        owner: 'A',
        toolClass: c,
        limit: 1,
        definitions: ['h'],
        ...(key ? { limits: { keyed: true } } : {}),
      });
      expect(first).toBeDefined();
      await store.clock.advance(1500);
      expect((await store.expireRuns(100)).expired).toBeGreaterThanOrEqual(1);
      expect((await store.getRun(run.id))!.state).toBe('expired');
      const late = await lateQueued(run.id, c, key);
      await claimsNothing(c);
      expect(await stateOf(late)).toBe('queued');
      // The sweep's next expiry cancels leftovers of the runs it expires; here the same statement is run for this run.
      // For the keyed case, a cancel of the expired run instead (a caller asking again): the run stays expired, and the
      // leftover is cancelled for the run's deadline.
      if (key) expect(await store.cancelRun(run.id)).toMatchObject({ cancelled: false, previousState: 'expired' });
      else {
        const { cancelLeftovers } = await import('../../src/store/deadline.js');
        expect(await cancelLeftovers(store.db, [run.id], 'run_deadline')).toBe(1);
      }
      expect(await stateOf(late)).toBe('cancelled');
      expect((await store.getRun(run.id))!.state).toBe('expired');
      const ev = await store.listEvents(run.id);
      expect(
        ev.filter((e) => e.type === 'stage_cancelled' && e.stageId === late).map((e) => (e.data as { reason?: string }).reason),
      ).toEqual(['run_deadline']);
      await claimsNothing(c);
    }
  });

  it('an expired lease of an ended run is not reclaimed; a cancel whose follow-up failed wrote nothing, and asked again it cancels the run with what a late plan queued', async () => {
    const c = `ended_${++n}`;
    const run = await store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: c })] });
    const [first] = await store.claim({ owner: 'A', toolClass: c, limit: 1, definitions: ['h'] });
    expect(first).toBeDefined();
    // A run ended by a racing statement while its stage stayed running (what the claim's run check guards).
    await db.query(`UPDATE ratchet.runs SET state = 'cancelled', finished_at = ratchet.db_now() WHERE id = $1`, [run.id]);
    await store.clock.advance(5000); // the lease expires
    await claimsNothing(c);
    expect(await stateOf(first!.id)).toBe('running');
    await db.query(`UPDATE ratchet.runs SET state = 'running', finished_at = NULL WHERE id = $1`, [run.id]);
    // The cancel's follow-up (the leftovers statement) fails: the caller sees the error, and the cancel is rolled back
    // with it (one transaction): the run and its running stage are as they were, with no event.
    await expect(cancelRun(failingOnce(store.db, 'ratchet_cancel_leftovers'), run.id)).rejects.toThrow(/Connection terminated/);
    expect((await store.getRun(run.id))!.state).toBe('running');
    expect(await stateOf(first!.id)).toBe('running');
    expect((await store.listEvents(run.id)).filter((e) => e.type === 'run_cancelled' || e.type === 'stage_cancelled')).toEqual([]);
    // A plan a finish committed meanwhile.
    const late = await lateQueued(run.id, c);
    // The caller asks again: this cancel ends the run, its running stage (reported) and the late stage.
    expect(await store.cancelRun(run.id)).toMatchObject({ cancelled: true, previousState: 'running', runningStageIds: [first!.id] });
    expect(await stateOf(first!.id)).toBe('cancelled');
    expect(await stateOf(late)).toBe('cancelled');
    await claimsNothing(c);
    // A stage a cancel of an earlier version left queued in the cancelled run (its follow-up was a statement of its
    // own): a cancel asked again sweeps it, the run staying as it was, with one event; a third adds none.
    await db.query(`DELETE FROM ratchet.events WHERE stage_id = $1`, [late]);
    await db.query(`DELETE FROM ratchet.stages WHERE id = $1`, [late]);
    const older = await lateQueued(run.id, c);
    expect(await store.cancelRun(run.id)).toMatchObject({ cancelled: false, previousState: 'cancelled' });
    expect(await stateOf(older)).toBe('cancelled');
    expect((await store.cancelRun(run.id))?.cancelled).toBe(false);
    expect((await store.listEvents(run.id)).filter((e) => e.type === 'stage_cancelled' && e.stageId === older)).toHaveLength(1);
  });

  it("an expiry whose follow-up failed wrote nothing: the next sweep expires the run and cancels its child run (issue 9's leftover: the child ran on)", async () => {
    const c = `ended_${++n}`;
    const parent = await store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      deadlineInMs: 1000,
      stages: [spec({ toolClass: c })],
    });
    const kid = await store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: c })] });
    // The parent's stage waits for the child run it started (what a step `{ workflow }` writes).
    const parentStage = (await store.getRun(parent.id))!.stages[0]!.id;
    await db.query(`UPDATE ratchet.stages SET state = 'waiting', deps_left = 1 WHERE id = $1`, [parentStage]);
    await db.query(`UPDATE ratchet.runs SET parent_run_id = $1, parent_stage_id = $2 WHERE id = $3`, [parent.id, parentStage, kid.id]);
    const [kidStage] = await store.claim({ owner: 'A', toolClass: c, limit: 1, definitions: ['h'] });
    expect(kidStage?.runId).toBe(kid.id);
    await store.clock.advance(1500);
    // The cascade to the child fails: the expiry is rolled back with it (before, the parent stayed expired and its
    // child running for good: no later sweep picked an expired run again).
    await expect(expireRuns(failingOnce(store.db, 'ratchet_cancel_descendants'), 100)).rejects.toThrow(/Connection terminated/);
    expect((await store.getRun(parent.id))!.state).toBe('queued'); // as before the sweep: its stage waits for the child
    expect((await store.getRun(kid.id))!.state).toBe('running');
    expect(await stateOf(kidStage!.id)).toBe('running');
    // The next sweep does all of it, and reports the child's running stage (its worker hears it at its next extend).
    const r = await store.expireRuns(100);
    expect(r).toMatchObject({ expired: 1, childrenCancelled: 1 });
    expect(r.runningStageIds).toContain(kidStage!.id);
    expect((await store.getRun(parent.id))!.state).toBe('expired');
    expect((await store.getRun(kid.id))!.state).toBe('cancelled');
    expect(await stateOf(kidStage!.id)).toBe('cancelled');
    expect((await store.listEvents(kid.id)).find((e) => e.type === 'run_cancelled')?.data).toEqual({ reason: 'parent_expired' });
    expect((await store.expireRuns(100)).expired).toBe(0);
  });

  it('the expiry reads runs_active_deadline_idx (its state list matches the index predicate)', async () => {
    const c = new pg.Client({ connectionString: db.url });
    await c.connect();
    try {
      await c.query('SET enable_seqscan = off'); // a near-empty table would be read whole either way
      const plan = (await c.query(`EXPLAIN ${EXPIRE_RUNS_SQL.replace('$1', '100')}`)).rows
        .map((r: Record<string, string>) => r['QUERY PLAN'])
        .join('\n');
      expect(plan).toContain('runs_active_deadline_idx');
    } finally {
      await c.end();
    }
  });
});
