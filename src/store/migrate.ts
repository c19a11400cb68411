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
 * Applies the migrations while the same connection holds a PostgreSQL advisory lock, so two
 * processes starting together apply them once and both end with the same schema.
 */
export async function migratePostgres(client: pg.PoolClient): Promise<void> {
  await client.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK_KEY]);
  try {
    await migratePg(drizzlePg({ client }), MIGRATION_CONFIG);
  } finally {
    await client.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK_KEY]);
  }
}

export async function migratePgliteDb(pglite: PGlite): Promise<void> {
  await pglite.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK_KEY]);
  try {
    await migratePglite(drizzlePglite({ client: pglite }), MIGRATION_CONFIG);
  } finally {
    await pglite.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK_KEY]);
  }
}
