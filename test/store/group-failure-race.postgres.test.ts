import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { finish } from '../../src/store/finish.js';
import { openStore, type FinishVerdict, type Store } from '../../src/store/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { spec } from './lease-suite.js';

/**
 * A group failure racing a map's expansion (issue 11): the map stage's finish inserts its items
 * while a sibling's failure for good fails the run. Forced interleaving: the expansion's
 * transaction is open when the failure starts; the failure waits on the map stage's row lock, the
 * expansion commits, and the failure's snapshot does not hold the new items. They must end
 * `cancelled` (never left queued in a failed run), and no claim takes them.
 */
describe('a group failure racing a map expansion (PostgreSQL)', () => {
  let db: TestDatabase;
  let store: Store;
  beforeAll(async () => {
    db = await createTestDatabase('group_failure_race');
    store = await openStore({ databaseUrl: db.url, poolSize: 4 });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });

  it('the items a concurrent expansion inserted are cancelled with the failed run', async () => {
    const run = await store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      sinksLeft: 2,
      stages: [
        { ...spec({ toolClass: 'race_map', name: 'each' }), deps: [], nextSeqs: [], sink: 'one_of' },
        { ...spec({ toolClass: 'race_side', name: 'side' }), deps: [], nextSeqs: [], sink: 'one_of' },
      ],
    });
    const [m] = await store.claim({ owner: 'A', toolClass: 'race_map', limit: 1 });
    const [s] = await store.claim({ owner: 'B', toolClass: 'race_side', limit: 1 });
    const item = (i: number) => ({
      seq: 1_000_000 + i,
      name: `each[${i}]`,
      step: 'each',
      tool: 'noop',
      toolClass: 'race_item',
      state: 'queued' as const,
      leaseMs: 3000,
      timeoutMs: 2000,
      maxDurationMs: 60_000,
      maxAttempts: 3,
      input: { i },
      deps: [],
      nextSeqs: [1],
      depsLeft: 0,
      continueOnError: false,
      sink: null,
      itemIndex: i,
      groupSeq: 1,
      idempotencyKey: `${run.id}:each:${i}`,
    });
    const error = { code: 'boom', message: 'side failed' };
    let failing: Promise<FinishVerdict[]> | undefined;
    let blocked = false;
    await store.db.transaction(async (tx) => {
      const [v] = await finish(tx, 'A', [
        { stageId: m!.id, fence: m!.fence, outcome: 'waiting', waitFor: 3, plan: [item(0), item(1), item(2)] },
      ]);
      expect(v!.accepted).toBe(true);
      failing = store.finish('B', [{ stageId: s!.id, fence: s!.fence, outcome: 'failed', error, run: { state: 'failed', error } }]);
      for (const end = Date.now() + 20_000; Date.now() < end && !blocked; ) {
        const [w] = await store.db.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`,
        );
        blocked = (w!.n as number) > 0;
        if (!blocked) await new Promise((r) => setTimeout(r, 2));
      }
    });
    const [f] = await failing!;
    expect(blocked).toBe(true);
    expect(f!.accepted).toBe(true);
    const r = (await store.getRun(run.id))!;
    expect(r.state).toBe('failed');
    const rows = await store.db.query(`SELECT name, state FROM ratchet.stages WHERE run_id = $1 ORDER BY seq`, [run.id]);
    expect(rows.map((x) => [x.name, x.state])).toEqual([
      ['each', 'cancelled'],
      ['side', 'failed'],
      ['each[0]', 'cancelled'],
      ['each[1]', 'cancelled'],
      ['each[2]', 'cancelled'],
    ]);
    expect(await store.claim({ owner: 'C', toolClass: 'race_item', limit: 10 })).toEqual([]);
  });
});
