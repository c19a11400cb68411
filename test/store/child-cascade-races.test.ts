import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Queryable } from '../../src/store/db.js';
import { openStore, type Store } from '../../src/store/index.js';
import { cancelDescendants } from '../../src/store/deadline.js';
import { cancelFailedLeftovers } from '../../src/store/leftovers.js';
import { until } from '../api/helpers.js';
import { failingOnce } from '../helpers/failing-db.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { spec } from './lease-suite.js';

/**
 * A run that ends must take its child runs with it, whatever a finish did meanwhile. A finish that starts a child run
 * (its stage running -> waiting, the child inserted) while a cancel waits for that stage's row commits a child the
 * cancel's snapshot never saw: the cancel's recursive child list misses it, and its re-check of the row cancels the
 * now-waiting stage. The child then ran on, claimed and executed, under a cancelled parent. The same for a run failed
 * by a claim, an extend or a finish (their follow-up, cancelFailedLeftovers). And a claim whose follow-up fails keeps
 * the stages it leased.
 */
describe('child runs never outlive an ended parent (PostgreSQL)', () => {
  let db: TestDatabase;
  let store: Store;
  let n = 0;
  beforeAll(async () => {
    db = await createTestDatabase('child_cascade_races');
    store = await openStore({ databaseUrl: db.url });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });

  const runState = async (id: string) => (await store.getRun(id))!.state;
  const stageStates = async (runId: string) => (await store.getRun(runId))!.stages.map((s) => s.state);
  /** A parent whose one stage is running, and a run (not yet its child) with one queued stage. */
  const parentAndLoneChild = async (c: string) => {
    const parent = await store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: c })] });
    const [stage] = await store.claim({ owner: 'A', toolClass: c, limit: 1, definitions: ['h'] });
    expect(stage?.runId).toBe(parent.id);
    const kid = await store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: `${c}_kid` })] });
    return { parent, stageId: stage!.id, kid };
  };
  /** What a finish that starts a child run commits: the parent's stage running -> waiting, the child under it. */
  const startChild = async (q: Queryable, parentId: string, stageId: string, kidId: string) => {
    await q.query(`UPDATE ratchet.stages SET state = 'waiting', deps_left = 1 WHERE id = $1`, [stageId]);
    await q.query(`UPDATE ratchet.runs SET parent_run_id = $1, parent_stage_id = $2 WHERE id = $3`, [parentId, stageId, kidId]);
  };

  it('a cancel that waited for the stage a finish turned into a child run cancels that child too', async () => {
    const c = `race_${++n}`;
    const { parent, stageId, kid } = await parentAndLoneChild(c);
    const session = new pg.Client({ connectionString: db.url });
    await session.connect();
    try {
      // The finish holds the parent's stage while it starts the child.
      await session.query('BEGIN');
      await session.query('SELECT id FROM ratchet.stages WHERE id = $1 FOR UPDATE', [stageId]);
      const cancel = store.cancelRun(parent.id);
      // (pg_stat_activity keeps the first 1 kB of a statement: the probe matches CANCEL_RUN_SQL's beginning.)
      await until(
        'the cancel to wait for the stage row',
        async () =>
          (
            await db.query<{ n: number }>(
              `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
                 AND wait_event_type = 'Lock' AND position('prev AS (SELECT id, state FROM ratchet.runs' in query) > 0`,
            )
          )[0]!.n > 0,
        10_000,
      );
      await startChild(session, parent.id, stageId, kid.id);
      await session.query('COMMIT');
      expect(await cancel).toMatchObject({ cancelled: true, previousState: 'running' });
    } finally {
      await session.end();
    }
    expect(await runState(parent.id)).toBe('cancelled');
    expect(await stageStates(parent.id)).toEqual(['cancelled']);
    // Without the second look (cancelDescendants) the child stayed queued, and the next claim of its class ran it.
    expect(await runState(kid.id)).toBe('cancelled');
    expect(await stageStates(kid.id)).toEqual(['cancelled']);
    expect(await store.claim({ owner: 'B', toolClass: `${c}_kid`, limit: 10, definitions: ['h'] })).toEqual([]);
    const ev = await store.listEvents(kid.id);
    expect(ev.filter((e) => e.type === 'run_cancelled').map((e) => e.data)).toEqual([{ reason: 'parent_cancelled' }]);
  });

  it('a run failed meanwhile: its follow-up (cancelFailedLeftovers) cancels the child a finish started, recursively', async () => {
    const c = `race_${++n}`;
    const { parent, stageId, kid } = await parentAndLoneChild(c);
    // A grandchild under the child, both active.
    const [kidStage] = await store.claim({ owner: 'A', toolClass: `${c}_kid`, limit: 1, definitions: ['h'] });
    const grandkid = await store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: `${c}_gk` })] });
    await startChild(db, parent.id, stageId, kid.id);
    await startChild(db, kid.id, kidStage!.id, grandkid.id);
    // The statement that failed the run (failRunsFrom) did not see the child: the run failed, the child left active.
    await db.query(`UPDATE ratchet.runs SET state = 'failed', finished_at = ratchet.db_now() WHERE id = $1`, [parent.id]);
    await db.query(`UPDATE ratchet.stages SET state = 'failed', finished_at = ratchet.db_now() WHERE id = $1`, [stageId]);
    expect(await cancelFailedLeftovers(store.db, [stageId])).toBe(0); // no stage of the failed run was left
    for (const id of [kid.id, grandkid.id]) {
      expect(await runState(id)).toBe('cancelled');
      expect(await stageStates(id)).toEqual(['cancelled']);
      const ev = await store.listEvents(id);
      expect(ev.filter((e) => e.type === 'run_cancelled').map((e) => e.data)).toEqual([{ reason: 'parent_ended' }]);
    }
    expect((await store.getRun(kid.id))!.error).toMatchObject({ message: 'its parent run ended' }); // what a retry of the parent revives
    expect(await runState(parent.id)).toBe('failed');
  });

  it('a claim whose follow-up fails still hands over the stages it leased', async () => {
    const c = `race_${++n}`;
    // A stage with one attempt, claimed, its lease expired: the next claim fails it (attempts spent) and its run.
    const spent = await store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      stages: [spec({ toolClass: c, maxAttempts: 1 })],
    });
    expect(await store.claim({ owner: 'A', toolClass: c, limit: 1, definitions: ['h'] })).toHaveLength(1);
    await store.clock.advance(5000);
    const live = await store.createRun({ workflow: 'w', definitionHash: 'h', input: {}, stages: [spec({ toolClass: c })] });
    const broken = failingOnce(store.db, 'ratchet_cancel_failed_leftovers');
    const { claim } = await import('../../src/store/claim.js');
    const got = await claim(broken, { owner: 'B', toolClass: c, limit: 10, definitions: ['h'] });
    expect(broken.failed()).toBe(true);
    expect(got.filter((s) => s.state === 'running').map((s) => s.runId)).toEqual([live.id]);
    expect(await runState(spent.id)).toBe('failed');
    expect(await stageStates(live.id)).toEqual(['running']);
  });

  it("a run retry that commits before or while a failure's follow-up looks for children wins: the retried child is left running", async () => {
    const c = `race_${++n}`;
    const { parent, stageId, kid } = await parentAndLoneChild(c);
    await startChild(db, parent.id, stageId, kid.id);
    const failBoth = () =>
      db.query(`UPDATE ratchet.runs SET state = 'failed', finished_at = ratchet.db_now() WHERE id = ANY($1::uuid[])`, [
        [parent.id, kid.id],
      ]);
    const reviveBoth = async (q: Queryable) => {
      await q.query(`UPDATE ratchet.runs SET state = 'running', finished_at = NULL WHERE id = $1`, [parent.id]);
      await q.query(`UPDATE ratchet.runs SET state = 'running', finished_at = NULL WHERE id = $1`, [kid.id]);
    };
    // The parent failed with its child (what failRunsFrom leaves), then a retry revived both before the follow-up's
    // look for children: the parent is no longer ended, so its child is nobody's orphan (before, it was cancelled).
    await failBoth();
    await reviveBoth(db);
    expect((await cancelDescendants(store.db, [parent.id], 'parent_ended')).runIds).toEqual([]);
    expect(await runState(kid.id)).toBe('running');
    // The retry commits while the look runs: the look waits for the parent's row (FOR SHARE), then reads it again.
    await failBoth();
    const session = new pg.Client({ connectionString: db.url });
    await session.connect();
    try {
      await session.query('BEGIN');
      await reviveBoth(session);
      let settled = false;
      const look = cancelDescendants(store.db, [parent.id], 'parent_ended').finally(() => {
        settled = true;
      });
      await until(
        'the look to wait for the parent row (or to end)',
        async () =>
          settled ||
          (
            await db.query<{ n: number }>(
              `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
                 AND wait_event_type = 'Lock' AND position('ended AS (SELECT p.id FROM ratchet.runs p' in query) > 0`,
            )
          )[0]!.n > 0,
        10_000,
      );
      await session.query('COMMIT');
      expect((await look).runIds).toEqual([]);
    } finally {
      await session.end();
    }
    expect(await runState(parent.id)).toBe('running');
    expect(await runState(kid.id)).toBe('running');
  });

  it("the sweeper's orphan pass cancels a child run left active under an ended parent (its follow-up lost), once", async () => {
    const c = `race_${++n}`;
    const { parent, stageId, kid } = await parentAndLoneChild(c);
    await startChild(db, parent.id, stageId, kid.id);
    await db.query(`UPDATE ratchet.runs SET state = 'failed', finished_at = ratchet.db_now() WHERE id = $1`, [parent.id]);
    await db.query(`UPDATE ratchet.stages SET state = 'failed', finished_at = ratchet.db_now() WHERE id = $1`, [stageId]);
    const d = await store.sweepOrphans(100);
    expect(d.runIds).toEqual([kid.id]);
    expect(await runState(kid.id)).toBe('cancelled');
    expect(await stageStates(kid.id)).toEqual(['cancelled']);
    expect((await store.listEvents(kid.id)).filter((e) => e.type === 'run_cancelled').map((e) => e.data)).toEqual([
      { reason: 'parent_ended' },
    ]);
    expect((await store.sweepOrphans(100)).runIds).toEqual([]);
  });

  it('a child run whose parent ended is not retried alone (parent_ended): it would run under an ended parent', async () => {
    const c = `race_${++n}`;
    const { parent, stageId, kid } = await parentAndLoneChild(c);
    await startChild(db, parent.id, stageId, kid.id);
    await db.query(`UPDATE ratchet.runs SET state = 'failed', finished_at = ratchet.db_now() WHERE id = ANY($1::uuid[])`, [
      [parent.id, kid.id],
    ]);
    await db.query(`UPDATE ratchet.stages SET state = 'failed', finished_at = ratchet.db_now() WHERE run_id = $1`, [kid.id]);
    expect(await store.retryRun(kid.id)).toMatchObject({ retried: false, previousState: 'failed', reason: 'parent_ended' });
    expect(await runState(kid.id)).toBe('failed');
    expect(await stageStates(kid.id)).toEqual(['failed']);
  });

  it('nor one whose parent stage took its end or is taking it (a succeeded parent, a stage past it, a stage claimed to take it); while the stage waits for it, or is queued to take its end, it is, and the stage waits for it again', async () => {
    const failedChildUnder = async (parentRun: string, parentStage: string) => {
      const c = `race_${++n}`;
      const { parent, stageId, kid } = await parentAndLoneChild(c);
      await startChild(db, parent.id, stageId, kid.id);
      await db.query(`UPDATE ratchet.runs SET state = 'failed', finished_at = ratchet.db_now() WHERE id = $1`, [kid.id]);
      await db.query(`UPDATE ratchet.stages SET state = 'failed', finished_at = ratchet.db_now() WHERE run_id = $1`, [kid.id]);
      await db.query(`UPDATE ratchet.stages SET state = $2 WHERE id = $1`, [stageId, parentStage]);
      await db.query(`UPDATE ratchet.runs SET state = $2 WHERE id = $1`, [parent.id, parentRun]);
      return kid.id;
    };
    for (const [parentRun, parentStage] of [
      ['succeeded', 'succeeded'],
      ['running', 'succeeded'],
      ['running', 'failed'],
      ['running', 'running'], // its claim has read the child's end: its finish carries it
    ]) {
      const kid = await failedChildUnder(parentRun!, parentStage!);
      expect(await store.retryRun(kid), `${parentRun} / ${parentStage}`).toMatchObject({ retried: false, reason: 'parent_ended' });
      expect(await stageStates(kid)).toEqual(['failed']);
    }
    for (const parentStage of ['waiting', 'queued']) {
      const kid = await failedChildUnder('running', parentStage);
      expect(await store.retryRun(kid), parentStage).toMatchObject({ retried: true });
      expect(await stageStates(kid)).toEqual(['queued']);
      // The parent stage waits for the retried child (its end queues it again), never claimed meanwhile to spin on it.
      const { parent_stage_id: ps } = (await db.query(`SELECT parent_stage_id::text FROM ratchet.runs WHERE id = $1`, [kid]))[0]!;
      const [row] = await db.query(`SELECT state, deps_left FROM ratchet.stages WHERE id = $1`, [ps]);
      expect(row, parentStage).toEqual({ state: 'waiting', deps_left: 1 });
    }
  });
});
