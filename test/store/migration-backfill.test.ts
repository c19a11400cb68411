import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate } from 'drizzle-orm/node-postgres/migrator';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { MIGRATIONS_FOLDER } from '../../src/store/migrate.js';
import { openStore } from '../../src/store/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/** Migration 0003 copies each existing stage's run definition hash before the claim needs it. */
describe('migration 0003 on a database with runs in flight', () => {
  let db: TestDatabase | undefined;
  const dir = mkdtempSync(join(tmpdir(), 'ratchet-mig-0002-'));
  afterAll(async () => {
    rmSync(dir, { recursive: true, force: true });
    await db?.drop();
  });

  it("gives every stage its run's definition hash, and the stages are claimed by a worker that names it", async () => {
    db = await createTestDatabase('mig_backfill', { empty: true });
    // The schema as of 0002: the committed migrations up to it.
    cpSync(MIGRATIONS_FOLDER, dir, { recursive: true });
    const journal = JSON.parse(readFileSync(join(dir, 'meta/_journal.json'), 'utf8')) as { entries: { tag: string }[] };
    journal.entries = journal.entries.filter((e) => e.tag < '0003');
    writeFileSync(join(dir, 'meta/_journal.json'), JSON.stringify(journal));
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      await migrate(drizzle({ client }), { migrationsFolder: dir, migrationsSchema: 'drizzle', migrationsTable: 'ratchet_migrations' });
      await client.query(`INSERT INTO ratchet.runs (id, workflow, definition_hash, input, state) VALUES
        ('00000000-0000-7000-8000-000000000001', 'w', 'hash-one', '{}', 'queued'),
        ('00000000-0000-7000-8000-000000000002', 'w', 'hash-two', '{}', 'queued')`);
      await client.query(`INSERT INTO ratchet.stages
        (run_id, seq, name, tool, tool_class, state, lease_ms, timeout_ms, max_duration_ms, max_attempts, idempotency_key)
        SELECT r.id, s, 'x', 'x', 'io', CASE WHEN s = 1 THEN 'queued' ELSE 'pending' END, 3000, 3000, 60000, 3, r.id::text || ':' || s
        FROM ratchet.runs r, generate_series(1, 2) s`);
    } finally {
      await client.end();
    }
    const store = await openStore({ databaseUrl: db.url, poolSize: 1 });
    try {
      const rows = await store.db.query(
        `SELECT r.definition_hash AS run, s.definition_hash AS stage FROM ratchet.stages s JOIN ratchet.runs r ON r.id = s.run_id`,
      );
      expect(rows).toHaveLength(4);
      for (const row of rows) expect(row.stage).toBe(row.run);
      const got = await store.claim({ owner: 'A', toolClass: 'io', limit: 10, definitions: ['hash-two'] });
      expect(got.map((s) => s.runId)).toEqual(['00000000-0000-7000-8000-000000000002']);
    } finally {
      await store.close();
    }
  });
});
