import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { MIGRATIONS_FOLDER } from '../../src/store/migrate.js';
import { openStore, type Queryable } from '../../src/store/index.js';
import { spawnTs } from '../helpers/child.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

const journal = JSON.parse(readFileSync(join(MIGRATIONS_FOLDER, 'meta/_journal.json'), 'utf8')) as { entries: unknown[] };

/** Everything that makes up the schema, in a comparable form. */
async function snapshot(q: Queryable) {
  const columns = await q.query(`SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns
    WHERE table_schema = 'ratchet' ORDER BY table_name, column_name`);
  const indexes = await q.query(`SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'ratchet' ORDER BY indexname`);
  const constraints = await q.query(`SELECT conname, pg_get_constraintdef(c.oid) AS def FROM pg_constraint c
    JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = 'ratchet' AND c.contype <> 'n' ORDER BY conname`);
  const functions = await q.query(
    `SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'ratchet' ORDER BY 1`,
  );
  const sequences = await q.query(`SELECT sequence_name FROM information_schema.sequences WHERE sequence_schema = 'ratchet' ORDER BY 1`);
  const [applied] = await q.query(`SELECT count(*)::int AS n FROM drizzle.ratchet_migrations`);
  return { columns, indexes, constraints, functions, sequences, applied: applied!.n };
}

describe('migrations', () => {
  const dbs: TestDatabase[] = [];
  afterAll(async () => {
    for (const db of dbs) await db.drop();
  });

  let reference: Awaited<ReturnType<typeof snapshot>>;

  it('applied twice end in the same schema', async () => {
    const db = await createTestDatabase('mig_twice', { empty: true });
    dbs.push(db);
    const first = await openStore({ databaseUrl: db.url, poolSize: 1 });
    reference = await snapshot(first.db);
    await first.close();
    const second = await openStore({ databaseUrl: db.url, poolSize: 1 });
    expect(await snapshot(second.db)).toEqual(reference);
    await second.close();
    expect(reference.applied).toBe(journal.entries.length);
    expect(reference.functions.map((f) => f.proname)).toEqual(['db_clock_now', 'db_now', 'notify_events']);
  });

  it('applied by two processes at once end in the same schema, each migration once', async () => {
    const db = await createTestDatabase('mig_race', { empty: true });
    dbs.push(db);
    const racers = [0, 1, 2].map(() => spawnTs('test/fixtures/store-process.ts', ['migrate', db.url]));
    const exits = await Promise.all(racers.map((r) => r.exit));
    expect(
      exits.map((e) => e.code),
      racers.map((r) => r.stderr()).join('\n'),
    ).toEqual([0, 0, 0]);
    const store = await openStore({ databaseUrl: db.url, poolSize: 1, migrate: false });
    expect(await snapshot(store.db)).toEqual(reference);
    await store.close();
  });

  it('the embedded PGlite store gets the same schema', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ratchet-mig-'));
    try {
      for (let i = 0; i < 2; i++) {
        const store = await openStore({ dataDir: dir });
        const snap = await snapshot(store.db);
        await store.close();
        expect(snap).toEqual(reference);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
