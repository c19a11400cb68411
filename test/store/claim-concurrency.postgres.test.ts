import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStore, type Store } from '../../src/store/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { insertQueuedStages } from '../helpers/stages.js';

const CLAIMERS = 16;
const STAGES = 2000;

describe('16 concurrent claimers on PostgreSQL over 2,000 queued stages', () => {
  let db: TestDatabase;
  let store: Store;
  beforeAll(async () => {
    db = await createTestDatabase('claimers');
    store = await openStore({ databaseUrl: db.url, poolSize: CLAIMERS + 2 });
  });
  afterAll(async () => {
    await store.close();
    await db.drop();
  });

  for (const limit of [1, 7]) {
    it(`claims every stage exactly once with claims of up to ${limit}`, async () => {
      const toolClass = `bulk${limit}`;
      await insertQueuedStages(store.db, STAGES, toolClass);
      const claimedBy = new Map<string, string>();
      const duplicates: string[] = [];
      let oversized = 0;
      let claims = 0;
      const claimer = async (owner: string) => {
        for (let empty = 0; empty < 3; ) {
          const got = await store.claim({ owner, toolClass, limit });
          claims++;
          if (got.length > limit) oversized++;
          if (got.length === 0) {
            empty++;
            continue;
          }
          empty = 0;
          for (const s of got) {
            if (claimedBy.has(s.id)) duplicates.push(s.id);
            claimedBy.set(s.id, owner);
          }
          const verdicts = await store.finish(
            owner,
            got.map((s) => ({
              stageId: s.id,
              fence: s.fence,
              outcome: 'succeeded' as const,
              result: { owner },
              run: { state: 'succeeded' as const, result: null },
            })),
          );
          expect(verdicts.every((v) => v.accepted)).toBe(true);
        }
      };
      // Any deadlock or serialisation error would reject here.
      await Promise.all(Array.from({ length: CLAIMERS }, (_, i) => claimer(`w${i}`)));

      expect(duplicates).toEqual([]);
      expect(oversized).toBe(0);
      expect(claimedBy.size).toBe(STAGES);
      expect(new Set(claimedBy.values()).size).toBeGreaterThan(1); // the work was really shared
      const [row] = await db.query(
        `SELECT count(*)::int AS n, count(DISTINCT fence)::int AS fences,
        count(*) FILTER (WHERE attempt = 1)::int AS first FROM ratchet.stages WHERE tool_class = $1 AND state = 'succeeded'`,
        [toolClass],
      );
      expect(row).toEqual({ n: STAGES, fences: STAGES, first: STAGES });
      const [ev] = await db.query(
        `SELECT count(*)::int AS n FROM ratchet.events e JOIN ratchet.stages s ON s.id = e.stage_id
        WHERE s.tool_class = $1 AND e.type = 'job_claimed'`,
        [toolClass],
      );
      expect(ev!.n).toBe(STAGES);
      expect(claims).toBeGreaterThan(0);
    });
  }
});
