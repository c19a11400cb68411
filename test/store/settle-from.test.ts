import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStore, type Store } from '../../src/store/index.js';
import { settleFrom } from '../../src/store/lease-common.sql.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { spec } from './lease-suite.js';

/**
 * settleFrom (lease-common.sql.ts), the run graph's settle fragment, used on its own: a statement
 * whose source CTE names stages already moved to a terminal state (as the waits do, waits-settle.ts)
 * decrements joins, queues successors, counts sinks, ends the run and wakes a parent's waiting stage.
 */
describe('settleFrom: the settle fragment over a source of done stages', () => {
  let db: TestDatabase;
  let store: Store;
  beforeAll(async () => {
    db = await createTestDatabase('settle_from');
    store = await openStore({ databaseUrl: db.url, poolSize: 2 });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });

  // Mark the stages (by seq) done, then settle them in one statement; the caller inserts _events.
  const settle = async (runId: string, done: { seq: number; value?: unknown; skipped?: boolean }[]) => {
    await store.db.query(
      `UPDATE ratchet.stages s SET state = CASE WHEN x.skipped THEN 'skipped' ELSE 'succeeded' END, result = x.value, finished_at = now()
       FROM jsonb_to_recordset($2::jsonb) AS x(seq int, value jsonb, skipped boolean) WHERE s.run_id = $1 AND s.seq = x.seq`,
      [runId, JSON.stringify(done)],
    );
    return store.db.query(
      `WITH RECURSIVE clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
      src AS (
        SELECT s.id, s.run_id, s.fence, s.next_seqs, NULL::int AS next_seq, s.sink, coalesce(s.step, s.name) AS step,
          s.result AS value, (s.state = 'skipped') AS skipped, false AS claim_next, NULL::jsonb AS next_input
        FROM ratchet.stages s WHERE s.run_id = $1 AND s.seq = ANY($2::int[])
      ),${settleFrom('src', 't')},
      ev AS (INSERT INTO ratchet.events (run_id, stage_id, type, fence, attempt, at, data) SELECT * FROM t_events RETURNING type)
      SELECT 'joined' AS part, j.seq, j.state, j.deps_left FROM t_joined j
      UNION ALL SELECT 'run_done', NULL, d.state, NULL FROM t_run_done d
      UNION ALL SELECT 'parent_woken', NULL, p.id::text, NULL FROM t_parent_woken p
      UNION ALL SELECT 'event', NULL, e.type, NULL FROM ev e
      ORDER BY 1, 2`,
      [runId, done.map((d) => d.seq)],
    );
  };

  it('a fan-out and a join: the join queued once its last dependency settles; the sink ends the run; events to insert', async () => {
    const run = await store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      sinksLeft: 1,
      stages: [
        { ...spec({ name: 'a' }), deps: [], nextSeqs: [3] },
        { ...spec({ name: 'b' }), deps: [], nextSeqs: [3] },
        { ...spec({ name: 'j' }), deps: [1, 2], nextSeqs: [], sink: 'only' },
      ],
    });
    expect(await settle(run.id, [{ seq: 1, value: 'A' }])).toEqual([{ part: 'joined', seq: 3, state: 'pending', deps_left: 1 }]);
    expect(await settle(run.id, [{ seq: 2, skipped: true }])).toEqual([{ part: 'joined', seq: 3, state: 'queued', deps_left: 0 }]);
    expect(await settle(run.id, [{ seq: 3, value: { joined: true } }])).toEqual([
      { part: 'event', seq: null, state: 'run_succeeded', deps_left: null },
      { part: 'run_done', seq: null, state: 'succeeded', deps_left: null },
    ]);
    const got = await store.getRun(run.id);
    expect(got!.state).toBe('succeeded');
    expect(got!.result).toEqual({ joined: true });
  });

  it('two sinks settled in one statement: one_of values keyed by step (a skipped one adds nothing); a parent stage woken', async () => {
    const parent = await store.createRun({
      workflow: 'p',
      definitionHash: 'h',
      input: {},
      sinksLeft: 1,
      stages: [{ ...spec({ name: 'sub' }), deps: [], nextSeqs: [], sink: 'only' }],
    });
    const [ps] = await store.db.query(
      `UPDATE ratchet.stages SET state = 'waiting' WHERE run_id = $1 AND seq = 1 RETURNING id::text AS id`,
      [parent.id],
    );
    const child = await store.createRun({
      workflow: 'c',
      definitionHash: 'h',
      input: {},
      sinksLeft: 3,
      stages: [
        { ...spec({ name: 'x' }), deps: [], nextSeqs: [], sink: 'one_of' },
        { ...spec({ name: 'y' }), deps: [], nextSeqs: [], sink: 'one_of' },
        { ...spec({ name: 'z' }), deps: [], nextSeqs: [], sink: 'one_of' },
      ],
    });
    await store.db.query(`UPDATE ratchet.runs SET parent_run_id = $1, parent_stage_id = $2 WHERE id = $3`, [parent.id, ps!.id, child.id]);
    expect((await settle(child.id, [{ seq: 1, value: 1 }])).map((r) => r.part)).toEqual(['run_done']);
    const out = await settle(child.id, [
      { seq: 2, value: 2 },
      { seq: 3, skipped: true },
    ]);
    expect(out).toEqual([
      { part: 'event', seq: null, state: 'run_succeeded', deps_left: null },
      { part: 'parent_woken', seq: null, state: ps!.id, deps_left: null },
      { part: 'run_done', seq: null, state: 'succeeded', deps_left: null },
    ]);
    expect((await store.getRun(child.id))!.result).toEqual({ x: 1, y: 2 });
    const [p] = await store.db.query(`SELECT state FROM ratchet.stages WHERE id = $1`, [ps!.id]);
    expect(p!.state).toBe('queued');
  });
});
