import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { claim } from '../../src/store/claim.js';
import { DatabaseUnavailableError } from '../../src/store/db-errors.js';
import type { Db, Queryable } from '../../src/store/db.js';
import { openStore, type Store } from '../../src/store/index.js';
import { ROW_HOLDING_IDLE_LIMIT_MS as LIMIT_MS } from '../../src/store/transaction-on.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { insertQueuedStages } from '../helpers/stages.js';

/**
 * A claimer paused in the middle of a limited claim's transaction (after picking its candidates FOR
 * UPDATE, before claiming them: a SIGSTOP, a long GC pause) must not keep the stages, nor the class
 * lock, from other workers for longer than LIMIT_MS: PostgreSQL ends its transaction, and
 * another claimer takes them. Without the limit, they stay locked until the paused client's
 * connection dies (the test's 5 s wait times out). The pause is made at the client: its statement
 * `ratchet_claim_ids` is held back until the test lets it go.
 */
describe('a claimer paused mid-claim', () => {
  let tdb: TestDatabase;
  let store: Store;
  beforeAll(async () => {
    tdb = await createTestDatabase('claim_paused');
    store = await openStore({ databaseUrl: tdb.url });
  });
  afterAll(async () => {
    await store?.close();
    await tdb?.drop();
  });

  /** store.db, whose connections run `before` ahead of each `ratchet_claim_ids` statement (the claim's last step). */
  const beforeClaimIds = (before: () => Promise<void> | void): Db => ({
    ...store.db,
    withConnection: (fn) =>
      store.db.withConnection((conn) =>
        fn({
          query: async (text, params, name, opts) => {
            if (name === 'ratchet_claim_ids') await before();
            return conn.query(text, params, name, opts);
          },
        } as Queryable),
      ),
  });

  /** store.db, whose `ratchet_claim_ids` statements wait for `gate` (and say so through `paused`). */
  function pausingDb(gate: Promise<void>): { db: Db; paused: Promise<void> } {
    let hit!: () => void;
    const paused = new Promise<void>((r) => {
      hit = r;
    });
    const db = beforeClaimIds(async () => {
      hit();
      await gate;
    });
    return { db, paused };
  }

  /** Claims as `owner` until it gets something, for at most `ms`; how long it took and what it got. */
  async function claimWithin(owner: string, toolClass: string, limits: Parameters<Store['claim']>[0]['limits'], ms: number) {
    const t0 = Date.now();
    for (;;) {
      const got = await store.claim({ owner, toolClass, limit: 10, definitions: ['h'], limits });
      if (got.length > 0 || Date.now() - t0 > ms) return { got, ms: Date.now() - t0 };
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  const cases = [
    { what: 'keyed (rows and keys held)', limits: { keyed: true }, key: { concurrencyKey: 'tenant', concurrencyLimit: 5 } },
    { what: 'a class limit (its class lock held)', limits: { classConcurrency: 5 }, key: {} },
  ];
  for (const c of cases) {
    it(`${c.what}: another worker claims the stages within the limit, each once; the paused claim takes none`, async () => {
      const cls = `paused-${c.limits.keyed ? 'keyed' : 'class'}`;
      await insertQueuedStages(store.db, 3, cls, c.key);
      let open!: () => void;
      const gate = new Promise<void>((r) => {
        open = r;
      });
      const { db, paused } = pausingDb(gate);
      const a = claim(db, { owner: 'A', toolClass: cls, limit: 10, definitions: ['h'], limits: c.limits }).then(
        (rows) => ({ rows, err: null as unknown }),
        (err: unknown) => ({ rows: [], err }),
      );
      await paused;
      // The paused transaction holds the three candidates (and the key or class lock): B waits for PostgreSQL to end it.
      // The gate opens whatever happens: a claim left waiting would keep its connection and hang the pool's end.
      const b = await claimWithin('B', cls, c.limits, LIMIT_MS + 4000).finally(open);
      const outcome = await a;
      expect(b.got.map((s) => s.attempt)).toEqual([1, 1, 1]);
      console.log(`${c.what}: B claimed ${b.got.length} stages ${b.ms} ms after A paused (limit ${LIMIT_MS} ms)`);
      // A's transaction was ended under it: its claim failed and took nothing.
      expect(outcome.rows).toEqual([]);
      expect(outcome.err).toBeTruthy();
      const rows = await store.db.query<{ owner: string; n: number }>(
        `SELECT owner_id AS owner, count(*)::int AS n FROM ratchet.stages WHERE tool_class = $1 AND state = 'running' GROUP BY 1`,
        [cls],
      );
      expect(rows).toEqual([{ owner: 'B', n: 3 }]);
      // The store still works on its pool (the ended connection was dropped, not handed back).
      expect(await store.clock.now()).toBeInstanceOf(Date);
    });
  }

  it('a claimer whose event loop was blocked past the limit is told the database is unavailable, frees its connection, claims nothing', async () => {
    const cls = 'paused-blocked';
    await insertQueuedStages(store.db, 2, cls, { concurrencyKey: 'tenant', concurrencyLimit: 5 });
    const db = beforeClaimIds(() => {
      const until = Date.now() + LIMIT_MS + 500; // the whole process stalls, as a long GC pause would
      while (Date.now() < until) {}
    });
    const err = await claim(db, { owner: 'A', toolClass: cls, limit: 10, definitions: ['h'], limits: { keyed: true } }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(DatabaseUnavailableError);
    const b = await store.claim({ owner: 'B', toolClass: cls, limit: 10, definitions: ['h'], limits: { keyed: true } });
    expect(b.map((s) => s.attempt)).toEqual([1, 1]);
  });
});
