import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/logger.js';
import { openStore, type Store } from '../../src/store/index.js';
import { pruneScheduleTicks, TICKS_KEPT_PER_SCHEDULE } from '../../src/store/prune.js';
import { deleteSchedule } from '../../src/store/schedules.js';
import { applyRetention } from '../../src/worker/retention.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

const H = 3_600_000;
const T0 = Date.parse('2026-01-01T00:00:00Z');
const at = (h: number) => new Date(T0 + h * H);

/** Schedule tick rows: retention deletes those nothing needs, in bounded batches; a delete takes its schedule's ticks. */
describe('schedule ticks: retention and delete', () => {
  let db: TestDatabase;
  let store: Store;
  beforeAll(async () => {
    db = await createTestDatabase('prune_ticks');
    store = await openStore({ databaseUrl: db.url });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });

  const schedule = (name: string, lastTickH: number) =>
    db.query(
      `INSERT INTO ratchet.schedules (name, cron, timezone, workflow, input, overlap, catch_up, source, last_tick_at, next_tick_at)
       VALUES ($1, '0 * * * *', 'UTC', 'w', '{}'::jsonb, 'skip', 3, 'api', $2, $3)`,
      [name, at(lastTickH), at(lastTickH + 1)],
    );
  /** Ticks from..to (hours) of `name`: 'started' with a run id (the run exists when `live` says so), or 'skipped'. */
  const ticks = async (name: string, from: number, to: number, live: (h: number) => boolean = () => false) => {
    for (let h = from; h <= to; h++) {
      const runId = h % 10 === 3 ? null : crypto.randomUUID();
      if (runId && live(h)) {
        await db.query(
          `INSERT INTO ratchet.runs (id, workflow, definition_hash, input, state) VALUES ($1, 'w', 'h', '{}'::jsonb, 'succeeded')`,
          [runId],
        );
      }
      await db.query(`INSERT INTO ratchet.schedule_ticks (schedule, tick_at, outcome, run_id) VALUES ($1, $2, $3, $4)`, [
        name,
        at(h),
        runId ? 'started' : 'skipped',
        runId,
      ]);
    }
  };
  const tickHours = async (name: string) =>
    (await db.query<{ t: Date }>(`SELECT tick_at AS t FROM ratchet.schedule_ticks WHERE schedule = $1 ORDER BY tick_at`, [name])).map(
      (r) => (r.t.getTime() - T0) / H,
    );
  const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

  it('keeps the latest ticks, ticks whose run is there and undecided failed ticks; deletes the rest and the ticks of deleted schedules', async () => {
    expect(TICKS_KEPT_PER_SCHEDULE).toBe(100);
    await schedule('hourly', 300);
    await ticks('hourly', 1, 300, (h) => h <= 5); // runs of ticks 1..5 are still there (not pruned yet)
    // A failed tick after the last decided one: tried again after its back-off, never pruned.
    await db.query(
      `INSERT INTO ratchet.schedule_ticks (schedule, tick_at, outcome, error) VALUES ('hourly', $1, 'failed', '{"code":"boom","message":"x"}')`,
      [at(301)],
    );
    await schedule('young', 50);
    await ticks('young', 1, 50);
    await ticks('deleted-long-ago', 1, 30); // no schedule row: left by a delete before ticks went with it

    const r = await pruneScheduleTicks(store.db, { batchSize: 7 });
    expect(r.complete).toBe(true);
    expect(r.batches).toBeGreaterThan(1);
    // hourly: 300 + 1 rows, kept: the runs of 1, 2, 4, 5 (3 was a skip) and the latest 100 rows (202..301, the failed 301 among them).
    expect(await tickHours('hourly')).toEqual([1, 2, 4, 5, ...range(202, 301)]);
    expect(await tickHours('young')).toEqual(range(1, 50));
    expect(await tickHours('deleted-long-ago')).toEqual([]);
    expect(r.ticks).toBe(301 - 104 + 30);
    // Nothing more to do: a second pass deletes nothing.
    expect((await pruneScheduleTicks(store.db, { batchSize: 7 })).ticks).toBe(0);
    // A bounded pass stops after its batches, saying so.
    await ticks('deleted-again', 1, 20);
    const bounded = await pruneScheduleTicks(store.db, { batchSize: 5, maxBatches: 2 });
    expect([bounded.ticks, bounded.complete]).toEqual([10, false]);
  });

  it("the retention pass (the sweeper's) prunes ticks too; deleting a schedule deletes its ticks", async () => {
    await ticks('gone-by-retention', 1, 12);
    await applyRetention(store, { succeeded: 30 * 24 * H }, silentLogger());
    expect(await tickHours('gone-by-retention')).toEqual([]);
    expect(await tickHours('deleted-again')).toEqual([]);

    await schedule('to-delete', 10);
    await ticks('to-delete', 1, 10);
    expect(await deleteSchedule(store.db, 'to-delete')).toBe(true);
    expect(await tickHours('to-delete')).toEqual([]);
    expect(await tickHours('hourly')).toHaveLength(104); // another schedule's ticks stay
  });
});
