import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { drizzle as drizzlePg } from 'drizzle-orm/node-postgres';
import { migrate as migratePg } from 'drizzle-orm/node-postgres/migrator';
import { drizzle as drizzlePglite } from 'drizzle-orm/pglite';
import { migrate as migratePglite } from 'drizzle-orm/pglite/migrator';
import type { PGlite } from '@electric-sql/pglite';
import type pg from 'pg';

/** The committed drizzle-kit migrations. */
export const MIGRATIONS_FOLDER = fileURLToPath(new URL('../../drizzle', import.meta.url));
const MIGRATION_CONFIG = { migrationsFolder: MIGRATIONS_FOLDER, migrationsSchema: 'drizzle', migrationsTable: 'ratchet_migrations' };

/** One advisory lock key for every Ratchet migrator (bigint; 'ratchet' in ASCII). */
export const MIGRATION_LOCK_KEY = '72617463686574';

/**
 * Indexes on the big, busy tables (stages, runs, events), built after the transactional
 * migrations with CREATE INDEX CONCURRENTLY, outside any transaction: a plain CREATE INDEX in
 * a migration would block every worker's writes for the whole build (and, in drizzle's one
 * transaction for all pending migrations, behind an ADD COLUMN's ACCESS EXCLUSIVE lock). Each
 * definition must match the one in ./schema.ts (drizzle-kit's snapshot lists it there, so no
 * generated migration creates it again). Append only; a new index on those tables goes here, never in
 * a migration (test/store/upgrade.test.ts checks the migrations).
 */
export const CONCURRENT_INDEXES: readonly { name: string; on: string; unique?: boolean }[] = [
  {
    name: 'stages_queued_priority_idx',
    on: `"ratchet"."stages" USING btree ("tool_class","definition_hash","priority" DESC NULLS LAST,"available_at","id")
      WHERE state = 'queued' and concurrency_key is null`,
  },
  {
    name: 'stages_queued_key_priority_idx',
    on: `"ratchet"."stages" USING btree ("tool_class","concurrency_key","definition_hash","priority" DESC NULLS LAST,"available_at","id")
      WHERE state = 'queued' and concurrency_key is not null`,
  },
  // The run graph (issue 11): one child run per parent stage (the child insert's ON CONFLICT arbiter), and a run's children.
  { name: 'runs_parent_stage_uq', unique: true, on: `"ratchet"."runs" USING btree ("parent_stage_id") WHERE parent_stage_id is not null` },
  { name: 'runs_parent_idx', on: `"ratchet"."runs" USING btree ("parent_run_id") WHERE parent_run_id is not null` },
];

export interface MigrateOptions {
  /** How long one migration attempt waits for a table lock before it gives up and lets the workers' queries through (default 5 s). */
  lockTimeoutMs?: number;
  /** Attempts before the migrator gives up (default 60); between them it waits a little longer each time, up to 5 s. */
  attempts?: number;
}

const LOCK_NOT_AVAILABLE = '55P03';

/**
 * Applies the migrations while the same connection holds a PostgreSQL advisory lock, so two
 * processes starting together apply them once and both end with the same schema.
 *
 * drizzle runs every pending migration in one transaction. Under running workers each attempt
 * has a lock_timeout: a DDL statement that waits for a table lock (behind a long transaction)
 * holds up every query queued behind it, so it gives up after lockTimeoutMs, the transaction
 * rolls back (nothing half-applied), the workers' queries go through, and the migrator retries.
 * Then the indexes of CONCURRENT_INDEXES are built concurrently (no transaction, no lock_timeout:
 * CREATE INDEX CONCURRENTLY blocks no reader or writer while it waits).
 */
export async function migratePostgres(client: pg.PoolClient | pg.Client, opts: MigrateOptions = {}): Promise<void> {
  const lockTimeoutMs = opts.lockTimeoutMs ?? 5000;
  const attempts = opts.attempts ?? 60;
  // Waits for the lock by trying, not in pg_advisory_lock: a migrator blocked inside that statement holds a snapshot, and
  // the holder's CREATE INDEX CONCURRENTLY waits for every older snapshot to go: the two would deadlock.
  while (!(await client.query('SELECT pg_try_advisory_lock($1) AS ok', [MIGRATION_LOCK_KEY])).rows[0]?.ok) await sleep(100);
  try {
    for (let attempt = 1; ; attempt++) {
      await client.query(`SELECT set_config('lock_timeout', $1, false)`, [`${Math.max(1, Math.floor(lockTimeoutMs))}ms`]);
      try {
        await migratePg(drizzlePg({ client }), MIGRATION_CONFIG);
        break;
      } catch (err) {
        if (!isLockTimeout(err) || attempt >= attempts) throw err;
        await sleep(Math.min(5000, 100 * attempt));
      } finally {
        await client.query('RESET lock_timeout');
      }
    }
    await buildConcurrentIndexes(client);
  } finally {
    await client.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK_KEY]);
  }
}

/** drizzle wraps the driver's error; the SQLSTATE is on it or on its cause. */
function isLockTimeout(err: unknown): boolean {
  for (let e = err as { code?: unknown; cause?: unknown } | undefined, i = 0; e && i < 5; e = e.cause as typeof e, i++) {
    if (e.code === LOCK_NOT_AVAILABLE) return true;
  }
  return false;
}

/**
 * Idempotent: an index already there and valid is kept (IF NOT EXISTS); one left INVALID by a
 * build that was interrupted (a crash, a cancel) is dropped and built again.
 */
async function buildConcurrentIndexes(client: pg.PoolClient | pg.Client): Promise<void> {
  // A build on a big table takes as long as it takes: no client-side query timeout (the pool's is 10 s), no statement_timeout.
  const long = (text: string) => client.query({ text, query_timeout: BUILD_TIMEOUT_MS } as pg.QueryConfig);
  await client.query(`SELECT set_config('statement_timeout', '0', false)`);
  try {
    await buildEach(client, long);
  } finally {
    await client.query('RESET statement_timeout');
  }
}

/** The client-side bound on one index build (a day): the pool's own query timeout would abandon a long build half done. */
const BUILD_TIMEOUT_MS = 24 * 3600 * 1000;

async function buildEach(client: pg.PoolClient | pg.Client, long: (text: string) => Promise<unknown>): Promise<void> {
  for (const ix of CONCURRENT_INDEXES) {
    const { rows } = await client.query(
      `SELECT i.indisvalid AS valid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
       JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'ratchet' AND c.relname = $1`,
      [ix.name],
    );
    if (rows[0]?.valid === true) continue;
    if (rows[0]) await long(`DROP INDEX CONCURRENTLY IF EXISTS "ratchet"."${ix.name}"`);
    await long(`CREATE ${ix.unique ? 'UNIQUE ' : ''}INDEX CONCURRENTLY IF NOT EXISTS "${ix.name}" ON ${ix.on}`);
  }
}

export async function migratePgliteDb(pglite: PGlite): Promise<void> {
  await pglite.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK_KEY]);
  try {
    await migratePglite(drizzlePglite({ client: pglite }), MIGRATION_CONFIG);
    // One process owns an embedded database: a plain build blocks no one else.
    for (const ix of CONCURRENT_INDEXES)
      await pglite.query(`CREATE ${ix.unique ? 'UNIQUE ' : ''}INDEX IF NOT EXISTS "${ix.name}" ON ${ix.on}`);
  } finally {
    await pglite.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK_KEY]);
  }
}
