import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Ratchet } from '../../src/engine.js';
import type { TestDatabase } from '../helpers/pg.js';
import type { PrivateRedis } from '../helpers/redis-server.js';
import type { Witness } from '../helpers/witness.js';
import { type FaultHarness, type Workers, openFaultHarness, reportAndKill, waitRun } from './helpers.js';

/** Peak of enter/exit pairs per group, in the witness's (causal) arrival order. */
function peak(witness: Witness, tool: string[], group: (o: Record<string, unknown>) => string): Map<string, number> {
  const now = new Map<string, number>();
  const max = new Map<string, number>();
  for (const o of witness.observations) {
    if (!tool.includes(o.tool as string)) continue;
    const g = group(o);
    if (o.kind === 'enter') now.set(g, (now.get(g) ?? 0) + 1);
    else if (o.kind === 'exit') now.set(g, (now.get(g) ?? 0) - 1);
    max.set(g, Math.max(max.get(g) ?? 0, now.get(g) ?? 0));
  }
  return max;
}

/**
 * Limits hold across worker processes and claim paths (BullMQ wake-ups, polling, batch
 * claims, the fast path), measured at the receiver and in the database's own claim history.
 */
describe('limits across workers', () => {
  let db: TestDatabase;
  let witness: Witness;
  let redis: PrivateRedis;
  let r: Ratchet;
  let workers: Workers;
  let harness: FaultHarness;
  beforeAll(async () => {
    harness = await openFaultHarness('limits', { redis: true });
    ({ db, witness, r, workers } = harness);
    redis = harness.redis!;
    await Promise.all([workers.spawn('w1'), workers.spawn('w2'), workers.spawn('w3')]);
  });
  afterEach(reportAndKill(() => workers, { keep: true }));
  afterAll(async () => {
    await harness.close();
  });

  it('a class with global concurrency 2 never runs more than 2 at once, and a key with limit 1 never more than 1', async () => {
    const ids: string[] = [];
    for (let n = 0; n < 24; n++) ids.push((await r.submit('limited', { user: `u${n % 3}`, n })).id);
    for (let n = 0; n < 24; n++) ids.push((await r.submit('keyed', { user: `u${n % 3}`, n })).id);
    for (const id of ids) await waitRun(r, id, (run) => run.state === 'succeeded', 120_000, `run ${id}`);

    const byClass = peak(witness, ['limited_work'], () => 'limited');
    expect(byClass.get('limited')).toBeLessThanOrEqual(2);
    expect(byClass.get('limited')).toBe(2); // the limit was reached, not merely unused
    const byKey = peak(witness, ['keyed_work', 'keyed_more'], (o) => o.user as string);
    expect([...byKey.values()].every((v) => v === 1)).toBe(true);
    expect(byKey.size).toBe(3);
    const pids = new Set(witness.observations.filter((o) => o.kind === 'enter').map((o) => o.pid));
    expect(pids.size).toBeGreaterThan(1); // several workers did the work
  });

  it('a rate limit of 5 per second is never exceeded in any window (the database claim history)', async () => {
    const ids: string[] = [];
    for (let n = 0; n < 20; n++) ids.push((await r.submit('rated', { user: 'x', n })).id);
    for (const id of ids) await waitRun(r, id, (run) => run.state === 'succeeded', 120_000, `run ${id}`);
    const rows = await db.query<{ at: Date }>(`SELECT e.at FROM ratchet.events e JOIN ratchet.stages s ON s.id = e.stage_id
      WHERE s.tool_class = 'rated' AND e.type IN ('job_claimed', 'lease_reclaimed') ORDER BY e.at`);
    expect(rows).toHaveLength(20);
    const t = rows.map((x) => x.at.getTime());
    for (let i = 0; i < t.length; i++) {
      const inWindow = t.filter((u) => u >= t[i]! && u < t[i]! + 1000).length;
      expect(inWindow, `window starting at claim ${i}`).toBeLessThanOrEqual(5);
    }
    expect(t[t.length - 1]! - t[0]!).toBeGreaterThanOrEqual(3000); // 20 claims at 5/s take at least 3 s
  });
});
