import { createHash } from 'node:crypto';

/**
 * The guard's statements, for one schema. They run in the *receiver's* database, so the
 * table is created with plain idempotent DDL rather than Ratchet's drizzle migrations.
 * bigint columns are read as text (a global pg type parser must not turn them into Numbers).
 */

export const DEFAULT_RECEIVER_SCHEMA = 'ratchet_receiver';

/** A schema name the guard accepts: a plain lowercase SQL identifier. */
export const SCHEMA_NAME = /^[a-z_][a-z0-9_]{0,62}$/;

function quoteIdent(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/**
 * A 64-bit advisory lock id for (schema, key), as a decimal string. Advisory lock ids are
 * one namespace per database, so the schema is hashed in; a collision (2^-64) would at worst
 * answer an unrelated key `in_progress` once.
 */
export function advisoryLockId(schema: string, key: string): string {
  return createHash('sha256').update(`ratchet_receiver\u0000${schema}\u0000${key}`).digest().readBigInt64BE(0).toString();
}

export interface EffectRow {
  fence: string;
  status: 'in_progress' | 'done';
  response_status: number | null;
  response_body: unknown;
}

export function receiverSql(schema: string) {
  const s = quoteIdent(schema);
  const t = `${s}.effects`;
  return {
    /** Run in one transaction under `migrateLock`, so concurrent migrate() calls do not race. */
    migrate: [
      `CREATE SCHEMA IF NOT EXISTS ${s}`,
      `CREATE TABLE IF NOT EXISTS ${t} (
        key text PRIMARY KEY,
        fence bigint NOT NULL CHECK (fence >= 0),
        status text NOT NULL CHECK (status IN ('in_progress', 'done')),
        response_status int CHECK (response_status BETWEEN 200 AND 499),
        response_body jsonb,
        updated_at timestamptz NOT NULL DEFAULT now(),
        CHECK ((status = 'done') = (response_status IS NOT NULL))
      )`,
    ],
    migrateLockId: advisoryLockId(schema, '\u0000migrate'),
    lock: 'SELECT pg_advisory_xact_lock($1::bigint)',
    /** Answers at once: false when another transaction holds this key. */
    tryLock: 'SELECT pg_try_advisory_xact_lock($1::bigint) AS locked',
    insertIfAbsent: `INSERT INTO ${t} (key, fence, status) VALUES ($1, $2::bigint, 'in_progress') ON CONFLICT (key) DO NOTHING`,
    /** NOWAIT: a row lock held outside the advisory lock is answered `in_progress` (55P03), not waited for. */
    lockRow: `SELECT fence::text AS fence, status, response_status, response_body FROM ${t} WHERE key = $1 FOR UPDATE NOWAIT`,
    raiseFence: `UPDATE ${t} SET fence = GREATEST(fence, $2::bigint), updated_at = now() WHERE key = $1`,
    storeResponse: `UPDATE ${t} SET status = 'done', response_status = $2, response_body = $3::jsonb, updated_at = now() WHERE key = $1`,
  };
}

export type ReceiverSql = ReturnType<typeof receiverSql>;
