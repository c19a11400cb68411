import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AGE_SHARE, claimSql, pickCandidatesSql } from '../../src/store/claim.sql.js';
import { openStore, type Store } from '../../src/store/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { insertQueuedStages } from '../helpers/stages.js';

/**
 * Priorities (issue 15) at the claim, on PostgreSQL: on every claim path (fast claim, limited
 * claim, keyed walk) due stages of higher priority are taken first, except the one claim in
 * AGE_SHARE (per process and class) that takes the oldest: a low-priority stage under a constant
 * stream of higher ones is still claimed within AGE_SHARE claims once it is the oldest. And the
 * claim reads one index range per hash without sorting the backlog.
 */
describe('priorities at the claim (PostgreSQL)', () => {
  let db: TestDatabase;
  let store: Store;
  beforeAll(async () => {
    db = await createTestDatabase('priorities');
    store = await openStore({ databaseUrl: db.url });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });
  const prioritiesOf = async (ids: string[]) =>
    (await db.query<{ p: number }>(`SELECT priority AS p FROM ratchet.stages WHERE id = ANY($1::bigint[]) ORDER BY id`, [ids])).map(
      (r) => r.p,
    );

  it.each([
    ['the fast claim', {}],
    ['the limited claim', { classConcurrency: 1000 }],
    ['the keyed walk', { keyed: true }],
  ] as const)(
    '%s takes a burst of high-priority stages before a backlog of low ones, one claim in AGE_SHARE by age',
    async (label, limits) => {
      const c = `prio_${label.replace(/\W/g, '_')}`;
      const keyed = 'keyed' in limits;
      const key = (i: number) => (keyed ? { concurrencyKey: `k${i % 7}`, concurrencyLimit: 1000 } : {});
      for (let i = 0; i < 7; i++) await insertQueuedStages(store.db, (300 / 7) | 0, c, { priority: 0, ...key(i) }); // the backlog, older
      for (let i = 0; i < 7; i++) await insertQueuedStages(store.db, 3, c, { priority: 50, ...key(i) }); // the burst, 21 stages
      const taken: number[][] = [];
      for (let i = 0; i < 8; i++) {
        const got = await store.claim({ owner: 'A', toolClass: c, limit: 3, definitions: ['h'], limits });
        taken.push(await prioritiesOf(got.map((s) => s.id)));
      }
      const byAge = taken.filter((t) => t.every((p) => p === 0));
      const byPriority = taken.filter((t) => t.every((p) => p === 50));
      expect(byAge.length + byPriority.length).toBe(8); // each claim took one kind only
      expect(byAge.length).toBe(8 / AGE_SHARE); // the age share, no more
      expect(byPriority.flat()).toHaveLength(18);
    },
  );

  it('the keyed walk takes the highest priorities it sees, not the first keys it visits; it stops at `limit` of the best seen', async () => {
    const c = 'prio_keys_across';
    // Keys in walk order: a low-priority one first, then higher ones; z (the highest) after the walk has what it needs.
    await insertQueuedStages(store.db, 1, c, { priority: 0, concurrencyKey: 'a0', concurrencyLimit: 5 });
    await insertQueuedStages(store.db, 1, c, { priority: 20, concurrencyKey: 'a1', concurrencyLimit: 5 });
    await insertQueuedStages(store.db, 1, c, { priority: 10, concurrencyKey: 'a2', concurrencyLimit: 5 });
    await insertQueuedStages(store.db, 1, c, { priority: 20, concurrencyKey: 'a3', concurrencyLimit: 5 });
    await insertQueuedStages(store.db, 1, c, { priority: 30, concurrencyKey: 'z', concurrencyLimit: 5 });
    // The first claim of a class in this process is by priority (one in AGE_SHARE is by age).
    const got = await store.claim({ owner: 'A', toolClass: c, limit: 2, definitions: ['h'], limits: { keyed: true } });
    expect((await prioritiesOf(got.map((x) => x.id))).sort((a, b) => b - a)).toEqual([20, 20]);
    // The walk goes on after a3: z first, then round to the rest.
    const next = await store.claim({ owner: 'A', toolClass: c, limit: 2, definitions: ['h'], limits: { keyed: true } });
    expect((await prioritiesOf(next.map((x) => x.id))).sort((a, b) => b - a)).toEqual([30, 10]);
  });

  it('a low-priority stage under a constant stream of higher ones is claimed within AGE_SHARE claims once it is the oldest', async () => {
    const c = 'prio_stream';
    await insertQueuedStages(store.db, 1, c, { priority: -100 });
    const low = (await db.query<{ id: string }>(`SELECT id::text AS id FROM ratchet.stages WHERE tool_class = $1`, [c]))[0]!.id;
    let claimedAt = -1;
    for (let i = 0; i < 3 * AGE_SHARE && claimedAt < 0; i++) {
      await insertQueuedStages(store.db, 4, c, { priority: 100 }); // always more high-priority work than one claim takes
      const got = await store.claim({ owner: 'A', toolClass: c, limit: 2, definitions: ['h'] });
      if (got.some((s) => s.id === low)) claimedAt = i;
    }
    expect(claimedAt).toBeGreaterThanOrEqual(0);
    expect(claimedAt).toBeLessThan(AGE_SHARE);
  });

  it('each claim reads one index range per hash, in priority order, without sorting the backlog', async () => {
    // A backlog large enough that sorting it is what the planner must avoid (on a few hundred rows a sort is cheaper).
    await insertQueuedStages(db, 30_000, 'prio_plan', { priority: 0 });
    await insertQueuedStages(db, 30_000, 'prio_plan', { priority: 3, definitionHash: 'h2' });
    await insertQueuedStages(db, 2000, 'prio_plan', { priority: 1, concurrencyKey: 'k', concurrencyLimit: 5 });
    await db.query('ANALYZE ratchet.stages');
    const c = new pg.Client({ connectionString: db.url });
    await c.connect();
    try {
      const explain = async (text: string, params: unknown[]) => {
        await c.query(`PREPARE p AS ${text}`);
        try {
          await c.query(`SET plan_cache_mode = force_generic_plan`);
          return (
            await c.query(
              `EXPLAIN EXECUTE p(${params.map((p) => (Array.isArray(p) ? `ARRAY[${p.map((x) => `'${x}'`).join(',')}]` : `'${p}'`)).join(',')})`,
            )
          ).rows
            .map((r: Record<string, string>) => r['QUERY PLAN'])
            .join('\n');
        } finally {
          await c.query('DEALLOCATE p');
          await c.query('RESET plan_cache_mode');
        }
      };
      const fast = await explain(claimSql(10, 2, 'priority'), ['A', 'prio_plan', ['h', 'h2']]);
      expect(fast, fast).toContain('stages_queued_priority_idx');
      // Each due range is read in index order from the priority index, at most rangeLimit rows; never a bitmap
      // scan of the whole due backlog then a sort (any Sort left is over at most rangeLimit rows per range).
      expect(fast).toMatch(
        /Index (Only )?Scan using stages_queued_priority_idx[^\n]*\n\s*Index Cond: \(\(tool_class = \$2\) AND \(definition_hash = \(\$3\)\[1\]\)/,
      );
      expect(fast).toMatch(
        /Index (Only )?Scan using stages_queued_priority_idx[^\n]*\n\s*Index Cond: \(\(tool_class = \$2\) AND \(definition_hash = \(\$3\)\[2\]\)/,
      );
      // (the run-failure cascade may read runs by bitmap, and the stages of the runs it ended by run id through
      // stages_run_seq_uq: only the stages' due backlog matters here, so no bitmap scan of any other stages index)
      expect(fast).not.toMatch(/Bitmap Index Scan on stages_(?!run_seq_uq)/);
      for (const heap of fast.match(/Bitmap Heap Scan on stages[^\n]*\n\s*Recheck Cond: [^\n]*/g) ?? [])
        expect(heap).toContain('(run_id = ANY');
      const aged = await explain(claimSql(10, 1, 'age'), ['A', 'prio_plan', ['h']]);
      expect(aged).toContain('stages_queued_claim_idx');
      const keyed = await explain(pickCandidatesSql(10, 1, true, 'priority'), ['A', 'prio_plan', ['h'], '']);
      expect(keyed).toContain('stages_queued_key_priority_idx');
    } finally {
      await c.end();
    }
  });
});

describe('the limited claim dates its leases from the claim, not from the start of its transaction', () => {
  let db: TestDatabase;
  let store: Store;
  beforeAll(async () => {
    db = await createTestDatabase('claim_clock');
    store = await openStore({ databaseUrl: db.url });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });

  it('a claim that waited on the class lock gets a lease starting after the wait', async () => {
    const c = 'clock_class';
    await insertQueuedStages(store.db, 1, c, { priority: 0 });
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    try {
      await holder.query('BEGIN');
      await holder.query(`SELECT pg_advisory_xact_lock(hashtextextended('ratchet:class:' || $1, 0))`, [c]);
      const claiming = store.claim({ owner: 'A', toolClass: c, limit: 1, definitions: ['h'], limits: { classConcurrency: 5 } });
      for (;;) {
        // This database's waiters only (other test files take advisory locks too).
        const [w] = await db.query(
          `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
        );
        if (w!.n > 0) break;
        await new Promise((r) => setTimeout(r, 20));
      }
      await new Promise((r) => setTimeout(r, 200)); // the claim's transaction started before this
      const [{ t }] = (await holder.query(`SELECT ratchet.db_clock_now() AS t`)).rows as [{ t: Date }];
      await holder.query('COMMIT');
      const [got] = await claiming;
      expect(got).toBeDefined();
      const [row] = await db.query<{ claimed_at: Date; lease_until: Date; lease_ms: number }>(
        `SELECT claimed_at, lease_until, lease_ms FROM ratchet.stages WHERE id = $1`,
        [got!.id],
      );
      expect(row!.claimed_at.getTime()).toBeGreaterThanOrEqual(t.getTime());
      expect(row!.lease_until.getTime()).toBeGreaterThanOrEqual(t.getTime() + row!.lease_ms);
    } finally {
      await holder.end();
    }
  });
});
