import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import pg from 'pg';
import type { TestProject } from 'vitest/node';
import { MIGRATIONS_FOLDER } from '../../src/store/migrate.js';
import { openStore } from '../../src/store/index.js';
import { databaseUrl, PG_ADMIN_URL } from './services.js';

declare module 'vitest' {
  export interface ProvidedContext {
    pgTemplate: string;
  }
}

/** Hash of the committed migrations: a template database per schema version. */
function migrationsHash(): string {
  const h = createHash('sha256');
  const walk = (dir: string) => {
    for (const f of readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const p = join(dir, f.name);
      if (f.isDirectory()) walk(p);
      else h.update(f.name).update(readFileSync(p));
    }
  };
  walk(MIGRATIONS_FOLDER);
  return h.digest('hex').slice(0, 12);
}

/**
 * Real services or nothing: PostgreSQL must answer, else the whole run fails (never skips).
 * Builds a migrated template database once; each test file clones it (fast, isolated).
 */
export default async function setup(project: TestProject): Promise<void> {
  const admin = new pg.Client({ connectionString: PG_ADMIN_URL, connectionTimeoutMillis: 5000 });
  try {
    await admin.connect();
  } catch (err) {
    throw new Error(
      `PostgreSQL is required for the tests and did not answer at ${PG_ADMIN_URL}: ${(err as Error).message}. ` +
        'Start it (see .ci/run) or set RATCHET_TEST_PG_URL.',
    );
  }
  try {
    const template = `ratchet_tpl_${migrationsHash()}`;
    const exists = await admin.query('SELECT 1 FROM pg_database WHERE datname = $1', [template]);
    if (exists.rowCount === 0) {
      const building = `${template}_build_${process.pid}`;
      await admin.query(`DROP DATABASE IF EXISTS ${building}`);
      await admin.query(`CREATE DATABASE ${building}`);
      const store = await openStore({ databaseUrl: databaseUrl(building), poolSize: 1 });
      await store.close();
      try {
        await admin.query(`ALTER DATABASE ${building} RENAME TO ${template}`);
      } catch {
        await admin.query(`DROP DATABASE IF EXISTS ${building}`); // another run built it first
      }
    }
    project.provide('pgTemplate', template);
  } finally {
    await admin.end();
  }
}
