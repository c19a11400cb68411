import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { explainRun } from '../../src/observability/explain.js';
import { openStore, type Store } from '../../src/store/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { spec } from '../store/lease-suite.js';

/** explain on a map stage waiting for its items, none of them leased or due: `waiting_for_items` with the map's maxParallel. */
describe('explain waiting_for_items (PostgreSQL)', () => {
  let db: TestDatabase;
  let store: Store;
  beforeAll(async () => {
    db = await createTestDatabase('explain_map');
    store = await openStore({ databaseUrl: db.url, poolSize: 2 });
  });
  afterAll(async () => {
    await store?.close();
    await db?.drop();
  });

  const mapRun = async (limit: number | null, key: (runId: string) => string | null) => {
    const run = await store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      sinksLeft: 1,
      stages: [{ ...spec({ name: 'each' }), deps: [], nextSeqs: [], sink: 'only' }],
    });
    await store.db.query(`UPDATE ratchet.stages SET state = 'waiting', deps_left = 3 WHERE run_id = $1`, [run.id]);
    await store.db.query(`UPDATE ratchet.runs SET state = 'running' WHERE id = $1`, [run.id]);
    for (let i = 0; i < 3; i++) {
      await store.db.query(
        `INSERT INTO ratchet.stages (run_id, definition_hash, seq, name, step, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms,
          max_attempts, idempotency_key, concurrency_key, concurrency_limit, next_seqs, item_index, group_seq)
         VALUES ($1, 'h', $2, $3, 'each', 'noop', 'io', $4, 3000, 2000, 60000, 3, $5, $6, $7, '{1}', $8, 1)`,
        [run.id, 1_000_000 + i, `each[${i}]`, i === 0 ? 'succeeded' : 'waiting', `${run.id}:each:${i}`, key(run.id), limit, i],
      );
    }
    return run.id;
  };

  it('names the map maxParallel (the limit of its items under the key run:step)', async () => {
    const id = await mapRun(5, (r) => `${r}:each`);
    const e = await explainRun({ store }, id);
    expect(e.verdict).toBe('waiting_for_items');
    expect(e.evidence).toMatchObject({ items: 3, succeeded: 1, maxParallel: 5 });
    expect(e.summary).toContain('at most 5 at once');
  });

  it('null without maxParallel, even when the items carry a workflow key', async () => {
    const id = await mapRun(2, () => 'tenant-a');
    const e = await explainRun({ store }, id);
    expect(e.verdict).toBe('waiting_for_items');
    expect(e.evidence).toMatchObject({ maxParallel: null });
  });
});
