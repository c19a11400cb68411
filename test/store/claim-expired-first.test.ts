import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { contendedKeyWait } from '../../src/store/claim.js';
import { AGE_SHARE } from '../../src/store/claim.sql.js';
import { openStore, type Store } from '../../src/store/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { insertQueuedStages } from '../helpers/stages.js';

/**
 * Issue 13 (reclaim within the lease + 1 s): an expired lease is taken before the class's due
 * backlog, on every claim path and in both claim orders. Before, the fast claim let expired
 * leases fill only what the due stages left of its limit, and the limited claim ranked them with
 * the due stages by (priority, time), so under a backlog larger than a claim's limit a dead
 * worker's stages waited until the backlog drained. A claim with room left still takes due stages
 * (expired leases only go first), and key limits hold.
 */
describe('expired leases before the due backlog (PostgreSQL)', () => {
  let db: TestDatabase;
  let store: Store;
  beforeAll(async () => {
    db = await createTestDatabase('claim_expired_first');
    store = await openStore({ databaseUrl: db.url });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });

  /** Inserts `n` due stages (lowest priority, newest) and turns them into leases of a dead owner that ended 500 ms ago. */
  async function expiredLeases(c: string, n: number, key: { concurrencyKey?: string; concurrencyLimit?: number }): Promise<string[]> {
    await insertQueuedStages(store.db, n, c, { priority: -100, ...key });
    const rows = await db.query<{ id: string }>(
      `UPDATE ratchet.stages SET state = 'running', owner_id = 'dead', fence = nextval('ratchet.fence_seq'), attempt = 1,
         lease_until = ratchet.db_now() - interval '500 milliseconds', claimed_at = ratchet.db_now() - interval '3500 milliseconds',
         heartbeat_at = ratchet.db_now() - interval '3500 milliseconds', first_claimed_at = ratchet.db_now() - interval '3500 milliseconds'
       WHERE id IN (SELECT id FROM ratchet.stages WHERE tool_class = $1 AND state = 'queued' AND priority = -100)
       RETURNING id::text AS id`,
      [c],
    );
    await db.query(
      `UPDATE ratchet.runs SET state = 'running' WHERE id IN (SELECT run_id FROM ratchet.stages WHERE id = ANY($1::bigint[]))`,
      [rows.map((r) => r.id)],
    );
    return rows.map((r) => r.id);
  }

  /** Polls until a backend of this database waits for an advisory lock (its pid) or `stopped()`; never queries once stopped. */
  async function waitingForKey(stopped: () => boolean): Promise<number | null> {
    while (!stopped()) {
      const [w] = await db.query<{ pid: number }>(
        `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1`,
      );
      if (w) return w.pid;
      await new Promise((r) => setTimeout(r, 10));
    }
    return null;
  }

  it.each([
    ['the fast claim', {}],
    ['the limited claim', { classConcurrency: 1000 }],
    ['the keyed claim', { keyed: true }],
  ] as const)('%s takes expired leases before a backlog of more due stages than its limit, in every claim order', async (label, limits) => {
    const c = `expired_first_${label.replace(/\W/g, '_')}`;
    const keyed = 'keyed' in limits;
    // AGE_SHARE claims of one class: AGE_SHARE - 1 by priority, one by age (claim.ts orderOf).
    for (let round = 0; round < AGE_SHARE; round++) {
      const key = keyed ? { concurrencyKey: `k${round}`, concurrencyLimit: 3 } : {};
      // The backlog: older than the leases' end and of a higher priority, more than a claim takes.
      await insertQueuedStages(store.db, 50, c, { priority: 100, ...key });
      const expired = await expiredLeases(c, 2, key);
      const got = await store.claim({ owner: 'B', toolClass: c, limit: 3, definitions: ['h'], limits });
      const ids = got.map((s) => s.id);
      expect(ids, `round ${round}`).toEqual(expect.arrayContaining(expired));
      expect(got.filter((s) => expired.includes(s.id)).every((s) => s.previousState === 'running' && s.state === 'running')).toBe(true);
      // Room left after the expired leases goes to the backlog: nothing starves.
      expect(got, `round ${round}`).toHaveLength(3);
      expect(got.filter((s) => !expired.includes(s.id)).every((s) => s.previousState === 'queued')).toBe(true);
    }
    if (keyed) {
      const over = await db.query(
        `SELECT concurrency_key AS k, count(*)::int AS n FROM ratchet.stages
         WHERE tool_class = $1 AND state = 'running' AND lease_until >= ratchet.db_now()
         GROUP BY concurrency_key HAVING count(*) > 3`,
        [c],
      );
      expect(over).toEqual([]); // each key's limit held
    }
  });

  it('a keyed claim gives a key with one seat left to its expired lease, not to its older due stage', async () => {
    const c = 'expired_first_seat';
    const key = { concurrencyKey: 'tenant', concurrencyLimit: 2 };
    await insertQueuedStages(store.db, 20, c, { priority: 100, ...key });
    const first = await store.claim({ owner: 'A', toolClass: c, limit: 1, definitions: ['h'], limits: { keyed: true } });
    expect(first).toHaveLength(1); // one live lease: one seat left under the key
    const [dead] = await expiredLeases(c, 1, key);
    for (let i = 0; i < AGE_SHARE; i++) {
      const got = await store.claim({ owner: 'B', toolClass: c, limit: 5, definitions: ['h'], limits: { keyed: true } });
      if (i === 0) expect(got.map((s) => s.id)).toEqual([dead]);
      else expect(got).toEqual([]); // the key is at its limit
    }
  });
  it('a keyed claim never waits for a key another claimer holds while it holds its candidates: the expired lease it picked is claimed at once', async () => {
    const c = 'expired_first_busy_key';
    await insertQueuedStages(store.db, 3, c, { priority: 100, concurrencyKey: 'busy', concurrencyLimit: 5 }); // older, higher priority
    const [dead] = await expiredLeases(c, 1, { concurrencyKey: 'free', concurrencyLimit: 5 });
    // Another claimer is inside its transaction with key 'busy' (e.g. its link to PostgreSQL was cut mid-claim).
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    let claiming: ReturnType<Store['claim']> | null = null;
    let stop = false;
    const waitBefore = contendedKeyWait.lockTimeoutMs;
    contendedKeyWait.lockTimeoutMs = 60_000; // the claim made again waits for the busy key until it is released below
    try {
      await holder.query('BEGIN');
      await holder.query(`SELECT pg_advisory_xact_lock(hashtextextended('ratchet:key:' || $1, 0))`, ['busy']);
      claiming = store.claim({ owner: 'B', toolClass: c, limit: 5, definitions: ['h'], limits: { keyed: true } });
      // The claim either finishes or waits for the busy key (made again for it): either way, by then the expired
      // lease is claimed and committed, visible to everyone, and the busy key's stages are untouched.
      const settled = claiming.then(() => 'done' as const);
      const waiting = waitingForKey(() => stop);
      await Promise.race([settled, waiting]);
      stop = true; // the poll ends before the database is dropped
      await waiting;
      const rows = await db.query<{ id: string; state: string; owner: string; key: string }>(
        `SELECT id::text AS id, state, owner_id AS owner, concurrency_key AS key FROM ratchet.stages WHERE tool_class = $1 ORDER BY id`,
        [c],
      );
      expect(rows.find((r) => r.id === dead)).toMatchObject({ state: 'running', owner: 'B' });
      expect(rows.filter((r) => r.key === 'busy').map((r) => r.state)).toEqual(['queued', 'queued', 'queued']);
    } finally {
      stop = true;
      await holder.query('COMMIT').catch(() => {});
      await holder.end();
    }
    // Once the key is free, the claim made again for it takes its stages; the key's limit holds.
    const got = await claiming!.finally(() => {
      contendedKeyWait.lockTimeoutMs = waitBefore;
    });
    expect(got.map((s) => s.id)).toContain(dead);
    expect(got).toHaveLength(4);
  });

  /**
   * Key `${c}_busy` with 3 due stages, an expired lease under key `${c}_free`, and another claimer holding the busy key's
   * lock. (Concurrency keys are counted across classes: each test has keys of its own.)
   */
  async function busyKeyHeld(c: string): Promise<{ dead: string; holder: pg.Client }> {
    await insertQueuedStages(store.db, 3, c, { priority: 100, concurrencyKey: `${c}_busy`, concurrencyLimit: 5 });
    const [dead] = await expiredLeases(c, 1, { concurrencyKey: `${c}_free`, concurrencyLimit: 5 });
    const holder = new pg.Client({ connectionString: db.url });
    await holder.connect();
    await holder.query('BEGIN');
    await holder.query(`SELECT pg_advisory_xact_lock(hashtextextended('ratchet:key:' || $1, 0))`, [`${c}_busy`]);
    return { dead: dead!, holder };
  }

  /** The live leases of `owner` in class `c`: compared with what the claim returned, nothing leased is left unreturned. */
  async function leasedTo(c: string, owner: string): Promise<string[]> {
    const rows = await db.query<{ id: string }>(
      `SELECT id::text AS id FROM ratchet.stages WHERE tool_class = $1 AND state = 'running' AND owner_id = $2 ORDER BY id`,
      [c, owner],
    );
    return rows.map((r) => r.id);
  }

  it('a claim made again that cannot get the busy key within its lock timeout returns the leases already committed', async () => {
    const c = 'expired_first_busy_timeout';
    const { dead, holder } = await busyKeyHeld(c);
    const waitBefore = contendedKeyWait.lockTimeoutMs;
    contendedKeyWait.lockTimeoutMs = 100;
    try {
      // The holder keeps the key past the lock timeout of every claim made again.
      const got = await store.claim({ owner: 'B', toolClass: c, limit: 5, definitions: ['h'], limits: { keyed: true } });
      expect(got.map((s) => s.id)).toEqual([dead]);
      expect(await leasedTo(c, 'B')).toEqual([dead]);
      const busy = await db.query<{ state: string }>(`SELECT state FROM ratchet.stages WHERE concurrency_key = $1`, [`${c}_busy`]);
      expect(busy.map((r) => r.state)).toEqual(['queued', 'queued', 'queued']);
    } finally {
      contendedKeyWait.lockTimeoutMs = waitBefore;
      await holder.query('COMMIT').catch(() => {});
      await holder.end();
    }
    // The key free, the next claim takes its stages.
    const next = await store.claim({ owner: 'B', toolClass: c, limit: 5, definitions: ['h'], limits: { keyed: true } });
    expect(next).toHaveLength(3);
  });

  it('a claim made again whose connection is killed while it waits for the busy key returns the leases already committed', async () => {
    const c = 'expired_first_busy_killed';
    const { dead, holder } = await busyKeyHeld(c);
    const waitBefore = contendedKeyWait.lockTimeoutMs;
    contendedKeyWait.lockTimeoutMs = 60_000; // the claim made again waits until its backend is killed
    let stop = false;
    try {
      const claiming = store.claim({ owner: 'B', toolClass: c, limit: 5, definitions: ['h'], limits: { keyed: true } });
      const settledEarly = claiming.then(
        () => 'settled' as const,
        () => 'settled' as const,
      );
      const waiting = waitingForKey(() => stop);
      const first = await Promise.race([settledEarly, waiting]);
      stop = true;
      const pid = await waiting;
      expect(first, 'the claim made again waits for the busy key').not.toBe('settled');
      expect(pid).not.toBeNull();
      // A PostgreSQL restart or a reset link, for this one backend: the claim made again fails mid-wait.
      await db.query('SELECT pg_terminate_backend($1)', [pid]);
      const got = await claiming;
      expect(got.map((s) => s.id)).toEqual([dead]);
      expect(await leasedTo(c, 'B')).toEqual([dead]);
      const busy = await db.query<{ state: string }>(`SELECT state FROM ratchet.stages WHERE concurrency_key = $1`, [`${c}_busy`]);
      expect(busy.map((r) => r.state)).toEqual(['queued', 'queued', 'queued']);
    } finally {
      stop = true;
      contendedKeyWait.lockTimeoutMs = waitBefore;
      await holder.query('COMMIT').catch(() => {});
      await holder.end();
    }
    // The killed connection was dropped from the pool: the next claim works and takes the busy key's stages.
    const next = await store.claim({ owner: 'B', toolClass: c, limit: 5, definitions: ['h'], limits: { keyed: true } });
    expect(next).toHaveLength(3);
  });
});
