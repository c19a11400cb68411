import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Ratchet } from '../../src/engine.js';
import type { Witness } from '../helpers/witness.js';
import { type FaultHarness, type Workers, openFaultHarness, reportAndKill, waitRun } from './helpers.js';

/**
 * A map's maxParallel across worker processes (issue 11), proven from the lease rows: two real
 * worker processes run two maps of 40 items with maxParallel 3 (fixture map-limit.ts). From each
 * item stage's [claimed_at, finished_at] (the limited claim dates its lease after the key lock:
 * claim.sql.ts CLAIM_IDS_SQL), and from every fence's own lease interval in the events (its claim
 * to its end), never more than 3 overlap per run; every item's effect is applied once at the fenced
 * witness; the results come in item order.
 */
const N = 40;
const LIMIT = 3;

/** The most intervals open at once; [start, end) half-open (an end at the instant of a start frees its slot first). */
function maxOverlap(intervals: { start: number; end: number }[]): number {
  const points = intervals.flatMap((x) => [
    { t: x.start, d: 1 },
    { t: x.end, d: -1 },
  ]);
  points.sort((a, b) => a.t - b.t || a.d - b.d);
  let open = 0;
  let max = 0;
  for (const p of points) {
    open += p.d;
    max = Math.max(max, open);
  }
  return max;
}

/** Microseconds since the epoch, from PostgreSQL (a JS Date would round to the millisecond). */
const US = `(extract(epoch FROM %s) * 1000000)::bigint::text`;
const us = (col: string) => US.replace('%s', col);

describe('map maxParallel across two worker processes, from the lease rows', () => {
  let witness: Witness;
  let r: Ratchet;
  let workers: Workers;
  let harness: FaultHarness;
  beforeAll(async () => {
    harness = await openFaultHarness('map_limit_faults');
    ({ witness, r, workers } = harness);
  });
  afterEach(reportAndKill(() => workers));
  afterAll(async () => {
    await harness.close();
  });

  it(`two maps of ${N} items, maxParallel ${LIMIT}: never more than ${LIMIT} leased at once per run, each effect once, results in order`, async () => {
    await workers.spawn('w1', { MAP_ITEM_MS: '60' });
    await workers.spawn('w2', { MAP_ITEM_MS: '60' });
    const runs = [(await r.submit('map_limit', { n: N })).id, (await r.submit('map_limit', { n: N })).id];
    for (const id of runs) {
      const done = await waitRun(
        r,
        id,
        (run) => ['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state),
        120_000,
        'map run ended',
      );
      expect(done.state).toBe('succeeded');
      expect((done.result as { i: number }[]).map((x) => x.i)).toEqual(Array.from({ length: N }, (_, i) => i));
    }
    const db = r.store.db;
    const pids = new Set<number>();
    for (const id of runs) {
      const items = await db.query(
        `SELECT id::text AS id, idempotency_key, state, attempt, ${us('claimed_at')} AS s, ${us('finished_at')} AS e
         FROM ratchet.stages WHERE run_id = $1::uuid AND item_index IS NOT NULL ORDER BY item_index`,
        [id],
      );
      expect(items).toHaveLength(N);
      expect(items.every((x) => x.state === 'succeeded')).toBe(true);
      const rows = items.map((x) => ({ start: Number(x.s), end: Number(x.e) }));
      expect(rows.every((x) => x.end >= x.start)).toBe(true);
      const byRows = maxOverlap(rows);
      expect(byRows).toBeLessThanOrEqual(LIMIT);
      expect(byRows).toBeGreaterThan(1); // they did run in parallel

      // Every fence's own lease: from its claim to the event that ended it (a retry, a finish, a loss).
      const ev = await db.query(
        `SELECT e.stage_id::text AS stage_id, e.fence::text AS fence, e.type, ${us('e.at')} AS at FROM ratchet.events e
         JOIN ratchet.stages s ON s.id = e.stage_id AND s.item_index IS NOT NULL
         WHERE e.run_id = $1::uuid AND e.fence IS NOT NULL ORDER BY e.id`,
        [id],
      );
      const leases = new Map<string, { start: number; end: number | null }>();
      for (const e of ev) {
        const k = `${e.stage_id}:${e.fence}`;
        if (e.type === 'job_claimed' || e.type === 'lease_reclaimed') leases.set(k, { start: Number(e.at), end: null });
        else if (['stage_succeeded', 'stage_failed', 'retry_scheduled', 'stage_cancelled', 'lease_released'].includes(e.type as string)) {
          const l = leases.get(k);
          if (l && l.end === null) l.end = Number(e.at);
        }
      }
      expect(leases.size).toBeGreaterThanOrEqual(N);
      for (const [k, l] of leases) expect(l.end, `lease ${k} ended`).not.toBeNull();
      expect(maxOverlap([...leases.values()].map((l) => ({ start: l.start, end: l.end! })))).toBeLessThanOrEqual(LIMIT);

      const applied = await witness.appliedPerKey();
      for (const x of items) expect(applied.get(x.idempotency_key as string), x.idempotency_key as string).toBe(1);
      for (const o of witness.observations) if (o.runId === id) pids.add(o.pid as number);
    }
    expect(witness.staleAccepted()).toEqual([]);
    // (which process took which item is up to the claims: both usually do; the limit holds either way)
    console.info(`map-limit: items ran in ${pids.size} worker process(es)`);
  });
});
