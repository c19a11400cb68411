import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStore, type Store } from '../../src/store/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { spec } from './lease-suite.js';

/**
 * failUnserved (opt-in, FAIL_UNSERVED_SQL) in the run graph: a child run it fails wakes its
 * parent's waiting child-run stage (which then fails with child_run_failed at its claim); a
 * continueOnError stage's no_worker is a value for what follows, not the run's failure.
 */
describe('failUnserved and the run graph', () => {
  let db: TestDatabase;
  let store: Store;
  beforeAll(async () => {
    db = await createTestDatabase('fail_unserved');
    store = await openStore({ databaseUrl: db.url, poolSize: 2 });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });

  it("a child run failed for want of a worker wakes its parent's waiting stage", async () => {
    const parent = await store.createRun({
      workflow: 'p',
      definitionHash: 'h',
      input: {},
      sinksLeft: 1,
      stages: [{ ...spec({ toolClass: 'ctl', name: 'sub' }), deps: [], nextSeqs: [], sink: 'only' }],
    });
    const [ps] = await store.db.query(`UPDATE ratchet.stages SET state = 'waiting' WHERE run_id = $1 RETURNING id::text AS id`, [
      parent.id,
    ]);
    const child = await store.createRun({
      workflow: 'c',
      definitionHash: 'h',
      input: {},
      sinksLeft: 1,
      stages: [{ ...spec({ toolClass: 'nobody', name: 'k' }), deps: [], nextSeqs: [], sink: 'only' }],
    });
    await store.db.query(`UPDATE ratchet.runs SET parent_run_id = $1, parent_stage_id = $2 WHERE id = $3`, [parent.id, ps!.id, child.id]);
    await store.clock.advance(5000);
    expect(await store.failUnserved(['nobody'], 1000)).toBe(1);
    const c = (await store.getRun(child.id))!;
    expect(c.state).toBe('failed');
    expect(c.error).toMatchObject({ code: 'no_worker' });
    const [p] = await store.db.query(`SELECT state FROM ratchet.stages WHERE id = $1`, [ps!.id]);
    expect(p!.state).toBe('queued');
    expect((await store.getRun(parent.id))!.state).not.toBe('failed'); // its stage decides at its claim (child_run_failed)
  });

  it("a continueOnError stage's no_worker is a value: the run goes on", async () => {
    const run = await store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      sinksLeft: 1,
      stages: [
        { ...spec({ toolClass: 'nobody2', name: 'opt' }), deps: [], nextSeqs: [2], continueOnError: true },
        { ...spec({ toolClass: 'io', name: 'after' }), deps: [1], nextSeqs: [], sink: 'only' },
      ],
    });
    await store.clock.advance(5000);
    expect(await store.failUnserved(['nobody2'], 1000)).toBe(1);
    const r = (await store.getRun(run.id))!;
    expect(r.state).toBe('queued'); // never claimed yet, and not failed
    expect(r.stages[0]!.error).toMatchObject({ code: 'no_worker', asValue: true });
    expect(r.stages[1]!.state).toBe('queued');
  });
});
