import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { finish } from '../../src/store/finish.js';
import { openStore, type FinishVerdict, type Store } from '../../src/store/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { spec } from './lease-suite.js';

/**
 * The join under a real race (issue 11): two branches of one join finish at the same instant,
 * through store.finish, by two owners, 200 times. Half the races send both finishes at once; the
 * other half force the interleaving: A's finish commits only after B's finish is seen waiting on
 * a row lock (pg_stat_activity), so B's statement re-evaluates the join counter on A's committed
 * row. Every time the join is queued exactly once (by exactly one of the two finishes), its
 * counter at 0, and the run still waiting for it.
 */
describe('the join is queued exactly once when its two dependencies finish at once (PostgreSQL)', () => {
  let db: TestDatabase;
  let store: Store;
  beforeAll(async () => {
    db = await createTestDatabase('join_race');
    store = await openStore({ databaseUrl: db.url, poolSize: 6 });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });

  const ROUNDS = 200;
  it(`${ROUNDS} races: the join queued exactly once every time (half of them with the second finish blocked on the first)`, async () => {
    let once = 0;
    let blocked = 0;
    const failures: string[] = [];
    for (let i = 0; i < ROUNDS; i++) {
      const c = 'race';
      const run = await store.createRun({
        workflow: 'w',
        definitionHash: 'h',
        input: {},
        sinksLeft: 1,
        stages: [
          { ...spec({ toolClass: c, name: 'b1' }), deps: [], nextSeqs: [3] },
          { ...spec({ toolClass: c, name: 'b2' }), deps: [], nextSeqs: [3] },
          { ...spec({ toolClass: 'race_join', name: 'j' }), deps: [1, 2], nextSeqs: [], sink: 'only' },
        ],
      });
      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 1 });
      const [b] = await store.claim({ owner: 'B', toolClass: c, limit: 1 });
      expect(a!.runId).toBe(run.id);
      expect(b!.runId).toBe(run.id);
      const row = (s: typeof a) => ({ stageId: s!.id, fence: s!.fence, outcome: 'succeeded' as const, result: s!.name });
      let va: FinishVerdict[];
      let vb: FinishVerdict[];
      if (i % 2 === 0) {
        [va, vb] = await Promise.all([store.finish('A', [row(a)]), store.finish('B', [row(b)])]);
      } else {
        let pb: Promise<FinishVerdict[]> | undefined;
        va = await store.db.transaction(async (tx) => {
          const v = await finish(tx, 'A', [row(a)]);
          pb = store.finish('B', [row(b)]);
          for (const end = Date.now() + 20_000; Date.now() < end; ) {
            const [w] = await store.db.query(
              `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`,
            );
            if ((w!.n as number) > 0) {
              blocked++;
              break;
            }
            await new Promise((r) => setTimeout(r, 2));
          }
          return v;
        });
        vb = await pb!;
      }
      expect(va[0]!.accepted && vb[0]!.accepted).toBe(true);
      const [j] = await store.db.query(`SELECT id::text AS id, state, deps_left FROM ratchet.stages WHERE run_id = $1 AND seq = 3`, [
        run.id,
      ]);
      const queuedBy = [...va[0]!.woken, ...vb[0]!.woken].filter((w) => w.stageId === j!.id).length;
      const [r] = await store.db.query(`SELECT state, sinks_left FROM ratchet.runs WHERE id = $1`, [run.id]);
      if (queuedBy === 1 && j!.state === 'queued' && j!.deps_left === 0 && r!.sinks_left === 1 && r!.state !== 'succeeded') once++;
      else failures.push(`race ${i}: queued by ${queuedBy} finishes, join ${JSON.stringify(j)}, run ${JSON.stringify(r)}`);
      // The join runs and ends the run: nothing left for the next race to claim.
      const [jc] = await store.claim({ owner: 'A', toolClass: 'race_join', limit: 1 });
      await store.finish('A', [{ stageId: jc!.id, fence: jc!.fence, outcome: 'succeeded', result: 'J' }]);
    }
    expect(failures).toEqual([]);
    expect(once).toBe(ROUNDS);
    expect(blocked).toBe(ROUNDS / 2);
  }, 300_000);
});
