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
  request_hash: string | null;
}

/** SQLSTATE the commit check raises: `invalid_transaction_termination`. */
export const HANDLER_ENDED_TRANSACTION = '2D000';

export function receiverSql(schema: string) {
  const s = quoteIdent(schema);
  const t = `${s}.effects`;
  return {
    /**
     * Run in one transaction under `migrateLock`, so concurrent migrate() calls do not race.
     * Forward-only and idempotent: a table made by an older version gains the new columns.
     * - request_hash: the fingerprint of the request whose response is stored (null when the
     *   caller gave none, and on rows from before the column).
     * - handler_open: true only inside the guard's own transaction, between admitting a
     *   request and storing its response. A deferred constraint trigger refuses to commit a
     *   row left open: a handler that runs COMMIT on the guard's transaction commits nothing.
     */
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
      `ALTER TABLE ${t} ADD COLUMN IF NOT EXISTS request_hash text`,
      `ALTER TABLE ${t} ADD COLUMN IF NOT EXISTS handler_open boolean NOT NULL DEFAULT false`,
      `CREATE OR REPLACE FUNCTION ${s}.refuse_open_effect() RETURNS trigger LANGUAGE plpgsql AS $fn$
      BEGIN
        IF EXISTS (SELECT 1 FROM ${t} WHERE key = NEW.key AND handler_open) THEN
          RAISE EXCEPTION 'ratchet/receiver: the effect handler ended the guard''s transaction; its writes are not committed'
            USING ERRCODE = '${HANDLER_ENDED_TRANSACTION}';
        END IF;
        RETURN NULL;
      END $fn$`,
      // CREATE CONSTRAINT TRIGGER has no IF NOT EXISTS (and no OR REPLACE).
      `DO $do$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger
                       WHERE tgname = 'effects_handler_closed' AND tgrelid = '${t.replace(/'/g, "''")}'::regclass) THEN
          CREATE CONSTRAINT TRIGGER effects_handler_closed AFTER UPDATE ON ${t}
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.handler_open) EXECUTE FUNCTION ${s}.refuse_open_effect();
        END IF;
      END $do$`,
    ],
    migrateLockId: advisoryLockId(schema, '\u0000migrate'),
    lock: 'SELECT pg_advisory_xact_lock($1::bigint)',
    /** Answers at once: false when another transaction holds this key. */
    tryLock: 'SELECT pg_try_advisory_xact_lock($1::bigint) AS locked',
    /** $1 key, $2 fence. A new key starts `in_progress` at the fence of its first request. */
    insertIfAbsent: `INSERT INTO ${t} (key, fence, status) VALUES ($1, $2::bigint, 'in_progress') ON CONFLICT (key) DO NOTHING`,
    /** $1 key. Read without a lock, outside a transaction: a done row never changes, so it is replayed from here. */
    readRow: `SELECT fence::text AS fence, status, response_status, response_body, request_hash FROM ${t} WHERE key = $1`,
    /** $1 key. NOWAIT: a row lock held outside the advisory lock is answered `in_progress` (55P03), not waited for. */
    lockRow: `SELECT fence::text AS fence, status, response_status, response_body, request_hash FROM ${t} WHERE key = $1 FOR UPDATE NOWAIT`,
    /**
     * $1 key, $2 fence. Admits a request to a key not done: keeps the highest fence and opens
     * the row, so the commit check (the deferred trigger) fires if the transaction commits
     * before the response is stored.
     */
    admit: `UPDATE ${t} SET fence = GREATEST(fence, $2::bigint), handler_open = true, updated_at = now() WHERE key = $1`,
    /** $1 key. After the handler failed or answered 5xx: its writes are rolled back, the admitted fence stays. */
    close: `UPDATE ${t} SET handler_open = false WHERE key = $1`,
    /**
     * $1 key, $2 status, $3 body (jsonb text), $4 request fingerprint or null. Only matches a row
     * this transaction opened: run outside it (the handler ended the transaction), it changes
     * nothing, and the guard sees zero rows.
     */
    storeResponse: `UPDATE ${t} SET status = 'done', response_status = $2, response_body = $3::jsonb, request_hash = $4,
      handler_open = false, updated_at = now() WHERE key = $1 AND handler_open`,
  };
}

export type ReceiverSql = ReturnType<typeof receiverSql>;
