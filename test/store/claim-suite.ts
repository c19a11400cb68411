import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Store } from '../../src/store/index.js';
import { insertQueuedStages } from '../helpers/stages.js';
import { spec } from './lease-suite.js';

/**
 * What a claim may take, the same tests on every back end: only stages of the definitions the
 * claimer has loaded (another version's wait, no attempt spent), and under concurrency keys,
 * the stages of keys with room whatever the backlog of a saturated key.
 */
export function claimConformance(backend: string, open: () => Promise<{ store: Store; cleanup: () => Promise<void> }>) {
  describe(`claim filters on ${backend}`, () => {
    let store: Store;
    let cleanup: () => Promise<void>;
    let n = 0;
    const cls = () => `f${++n}`; // each test its own tool class
    beforeAll(async () => {
      ({ store, cleanup } = await open());
    });
    afterAll(async () => {
      await cleanup();
    });
    const stageOf = async (runId: string) => (await store.getRun(runId))!.stages[0]!;

    it('takes only stages of the definitions it names: another version waits, no attempt spent, not even its expired lease', async () => {
      const c = cls();
      const v1 = await store.createRun({ workflow: 'w', definitionHash: 'v1', input: {}, stages: [spec({ toolClass: c })] });
      const v2 = await store.createRun({ workflow: 'w', definitionHash: 'v2', input: {}, stages: [spec({ toolClass: c })] });
      const got = await store.claim({ owner: 'B', toolClass: c, limit: 10, definitions: ['v2'] });
      expect(got.map((s) => [s.runId, s.definitionHash])).toEqual([[v2.id, 'v2']]);
      expect(await store.claim({ owner: 'B', toolClass: c, limit: 10, definitions: ['v2'], limits: { classConcurrency: 10 } })).toEqual([]);
      expect(await stageOf(v1.id)).toMatchObject({ state: 'queued', attempt: 0 });

      const [a] = await store.claim({ owner: 'A', toolClass: c, limit: 10, definitions: ['v1', 'other'] });
      expect(a).toMatchObject({ runId: v1.id, attempt: 1 });
      await store.clock.advance(3001); // both leases expire
      const reclaimed = await store.claim({ owner: 'B', toolClass: c, limit: 10, definitions: ['v2'] });
      expect(reclaimed.map((s) => [s.runId, s.previousState])).toEqual([[v2.id, 'running']]);
      expect(await stageOf(v1.id)).toMatchObject({ state: 'running', attempt: 1, fence: a!.fence });
      const [again] = await store.claim({ owner: 'C', toolClass: c, limit: 10, definitions: ['v1'] });
      expect(again).toMatchObject({ runId: v1.id, attempt: 2, previousState: 'running' });
    });

    it('naming several definitions, takes their due stages in order across them; naming none takes any', async () => {
      const c = cls();
      const runs = [];
      for (const h of ['a', 'b', 'a', 'b']) {
        runs.push(await store.createRun({ workflow: 'w', definitionHash: h, input: {}, stages: [spec({ toolClass: c })] }));
      }
      const first = await store.claim({ owner: 'A', toolClass: c, limit: 3, definitions: ['b', 'a'] });
      expect(first.map((s) => s.runId)).toEqual(runs.slice(0, 3).map((r) => r.id));
      expect((await store.claim({ owner: 'A', toolClass: c, limit: 3 })).map((s) => s.runId)).toEqual([runs[3]!.id]);
      expect(await store.claim({ owner: 'A', toolClass: c, limit: 3, definitions: [] })).toEqual([]);
    });

    it("a saturated key's backlog of 2,000 never hides another key's stages; the limits still hold", async () => {
      const c = cls();
      const keyed = { keyed: true } as const;
      await insertQueuedStages(store.db, 2000, c, { concurrencyKey: 'tenant-a', concurrencyLimit: 2 });
      const a = await store.claim({ owner: 'A', toolClass: c, limit: 10, definitions: ['h'], limits: keyed });
      expect(a.map((s) => s.state)).toEqual(['running', 'running']); // tenant-a is at its limit
      await store.clock.advance(1000);
      await insertQueuedStages(store.db, 5, c, { concurrencyKey: 'tenant-b', concurrencyLimit: 2 });
      const b = await store.claim({ owner: 'B', toolClass: c, limit: 10, definitions: ['h'], limits: keyed });
      expect(b).toHaveLength(2);
      const keys = async (ids: string[]) =>
        (await store.db.query(`SELECT DISTINCT concurrency_key AS k FROM ratchet.stages WHERE id = ANY($1::bigint[])`, [ids])).map(
          (r) => r.k as string,
        );
      expect(await keys(b.map((s) => s.id))).toEqual(['tenant-b']);
      expect(await store.claim({ owner: 'B', toolClass: c, limit: 10, definitions: ['h'], limits: keyed })).toEqual([]); // both at their limit
      await store.finish('B', [
        { stageId: b[0]!.id, fence: b[0]!.fence, outcome: 'succeeded', result: {}, run: { state: 'succeeded', result: {} } },
      ]);
      const next = await store.claim({ owner: 'B', toolClass: c, limit: 10, definitions: ['h'], limits: keyed });
      expect(next).toHaveLength(1);
      expect(await keys(next.map((s) => s.id))).toEqual(['tenant-b']);
      const [live] = await store.db.query(
        `SELECT count(*) FILTER (WHERE concurrency_key = 'tenant-a')::int AS a,
        count(*) FILTER (WHERE concurrency_key = 'tenant-b')::int AS b FROM ratchet.stages WHERE tool_class = $1 AND state = 'running'`,
        [c],
      );
      expect(live).toEqual({ a: 2, b: 2 });
    });

    it('keys with room take turns: each keyed claim goes on from the key after the last one it looked at, and wraps', async () => {
      const c = cls();
      for (const k of ['x', 'y', 'z']) await insertQueuedStages(store.db, 4, c, { concurrencyKey: `${c}-${k}`, concurrencyLimit: 10 });
      const order: string[] = [];
      for (let i = 0; i < 4; i++) {
        const got = await store.claim({ owner: 'A', toolClass: c, limit: 2, definitions: ['h'], limits: { keyed: true } });
        const [row] = await store.db.query(
          `SELECT string_agg(DISTINCT concurrency_key, ',') AS k FROM ratchet.stages WHERE id = ANY($1::bigint[])`,
          [got.map((s) => s.id)],
        );
        order.push(row!.k as string);
      }
      expect(order).toEqual(['x', 'y', 'z', 'x'].map((k) => `${c}-${k}`));
    });
  });
}
