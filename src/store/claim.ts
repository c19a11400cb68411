import { cancelFailedLeftovers } from './leftovers.js';
import { classifyDbError } from './db-errors.js';
import { z } from 'zod';
import type { Db, Queryable, Row } from './db.js';
import { ROW_HOLDING_IDLE_LIMIT_MS, transactionOn } from './transaction-on.js';
import {
  AGE_SHARE,
  CLAIM_IDS_SQL,
  claimSql,
  type ClaimOrder,
  COUNT_RATE_SQL,
  COUNT_RUNNING_CLASS_SQL,
  COUNT_RUNNING_KEYS_SQL,
  LOCK_CLASS_SQL,
  LOCK_KEYS_SQL,
  TRY_LOCK_KEYS_SQL,
  MAX_CLAIM_DEFINITIONS,
  pickCandidatesSql,
  RECORD_RATE_SQL,
  WAITING_DEFINITIONS_SQL,
} from './claim.sql.js';
import { monotonicNow, toClaimed, type ClaimedStage } from './lease.js';
import { parseInput, TIMER_MS_MAX } from './validate.js';

export const claimLimitsSchema = z
  .object({
    /** At most this many stages of the class hold a live lease at once, across all workers. */
    classConcurrency: z.number().int().min(1).max(100_000).optional(),
    /** At most `max` claims of the class start in any window of `windowMs`, across all workers. */
    rate: z
      .object({
        max: z.number().int().min(1).max(1_000_000),
        windowMs: z.number().int().min(1).max(TIMER_MS_MAX),
      })
      .strict()
      .optional(),
    /** The class has stages under concurrency keys: count live leases per key before claiming. */
    keyed: z.boolean().optional(),
  })
  .strict();
export type ClaimLimits = z.input<typeof claimLimitsSchema>;

const claimArgs = z
  .object({
    owner: z.string().min(1).max(200),
    toolClass: z.string().min(1).max(200),
    limit: z.number().int().min(1).max(1000),
    /**
     * Hashes of the workflow definitions this claimer has loaded: only stages of runs started
     * with one of them are claimed; the rest wait, no attempt spent, for a claimer that has them.
     * A worker always names them; omitted (tools, tests) means any definition.
     */
    definitions: z.array(z.string().min(1).max(200)).max(MAX_CLAIM_DEFINITIONS).optional(),
    limits: claimLimitsSchema.optional(),
  })
  .strict();

/**
 * Where each keyed claim's walk over concurrency keys goes on from, per store and class: the
 * last key the previous claim looked at, so keys with room take turns (a scheduling hint,
 * kept in this process; losing it costs nothing but order).
 */
const keyCursors = new WeakMap<Db, Map<string, string>>();
/** Claims made per class by this process: every AGE_SHARE-th takes the oldest due stages first (claim.sql.ts, ClaimOrder). */
const claimCounts = new WeakMap<Db, Map<string, number>>();
function orderOf(db: Db, toolClass: string): ClaimOrder {
  const counts = claimCounts.get(db) ?? new Map<string, number>();
  claimCounts.set(db, counts);
  const n = ((counts.get(toolClass) ?? 0) + 1) % AGE_SHARE;
  counts.set(toolClass, n);
  return n === 0 ? 'age' : 'priority';
}

/**
 * Claims up to `limit` due stages of one tool class and of the definitions the claimer has
 * loaded. Without limits: one atomic statement (stages under a concurrency key are left
 * alone). With limits: a short transaction that serialises the class's claims (advisory
 * lock), counts live leases and the rate window by the database clock, picks candidates
 * (stages of keys with room found by a walk over keys, whatever the backlog of saturated
 * keys), try-locks their concurrency keys (never waiting while it holds candidate rows; a key
 * another claimer holds is skipped) and counts the live leases of the keys it got, then claims
 * only what fits — so the limits hold whatever the number of workers and whichever path woke
 * them. A claim that skipped keys is made again, at most CONTENDED_RETRIES more transactions on
 * the same connection, each waiting a bounded time for those keys first (claimLimitedThenCursor).
 * Rows with state 'failed' are stages whose attempt budget was spent (not claimed).
 */
export async function claim(db: Db, args: z.input<typeof claimArgs>): Promise<ClaimedStage[]> {
  const { owner, toolClass, limit, definitions, limits } = parseInput(claimArgs, args, 'claim');
  const sentAt = monotonicNow(); // read before asking the pool for a connection
  const hashes = definitions
    ? [...new Set(definitions)]
    : (await db.query(WAITING_DEFINITIONS_SQL, [toolClass])).map((r) => r.definition_hash as string);
  if (hashes.length === 0) return [];
  const limited = limits && (limits.classConcurrency !== undefined || limits.rate !== undefined || limits.keyed);
  const by = orderOf(db, toolClass);
  const rows = limited
    ? await claimLimitedThenCursor(db, { owner, toolClass, limit, hashes, by }, limits)
    : await db.query(claimSql(limit, hashes.length, by), [owner, toolClass, hashes], `ratchet_claim_${limit}_${hashes.length}_${by}`);
  // A spent budget failed runs (failRunsFrom): what a concurrent finish inserted into them meanwhile is cancelled now.
  // The claim has committed: its stages are leased to this worker, so a follow-up the database did not answer (or
  // aborted) must not lose them (each would cost an attempt). The stages it leaves no claim takes (RUN_IS_ACTIVE); a
  // child run it leaves active, the sweeper's orphan pass cancels (sweepOrphans).
  await cancelFailedLeftovers(
    db,
    rows.filter((r) => r.state === 'failed').map((r) => r.id as string),
  ).catch((err: unknown) => {
    const kind = classifyDbError(err);
    if (kind !== 'unavailable' && kind !== 'conflict') throw err;
    return 0;
  });
  return rows.map((r) => toClaimed(r, sentAt));
}

interface ClaimOf {
  owner: string;
  toolClass: string;
  limit: number;
  hashes: string[];
  by: ClaimOrder;
}

/** The key cursor this process's next keyed claim of `toolClass` starts after (tests). */
export const keyCursorOf = (db: Db, toolClass: string): string | undefined => keyCursors.get(db)?.get(toolClass);

/** Limited claims made again when a key was skipped because another claimer held its lock (TRY_LOCK_KEYS_SQL). */
const CONTENDED_RETRIES = 2;

/**
 * How long a claim made again waits for the keys it found held (lock_timeout of its transaction),
 * in ms. Short: the leases the first transaction committed are returned only after it, and a
 * key's lock is normally held for one claim's few statements; a holder that keeps it longer (its
 * link to PostgreSQL cut mid-claim: held until its connection is reset) is skipped this time.
 * Tests raise it to hold the claim in its wait.
 */
export const contendedKeyWait = { lockTimeoutMs: 200 };

/** lock_not_available: a lock wait ran past lock_timeout. */
const LOCK_NOT_AVAILABLE = '55P03';
const codeOf = (err: unknown): unknown => (err instanceof Error ? (err as { code?: unknown }).code : undefined);

/**
 * The limited claim's transactions; the key cursor moves only once one committed (a rolled-back
 * walk gives no key its turn). A claim that skipped keys another claimer held, and took less than
 * its limit, is made again in a new transaction (at most CONTENDED_RETRIES times) that first waits
 * for those keys' locks, holding no candidate row yet (LOCK_KEYS_SQL), then picks: the stages of a
 * contended key are claimed after its holder is done, as when the claim waited for it, and no
 * candidate (an expired lease) is hidden from other claimers meanwhile.
 *
 * What a transaction committed is this owner's leases: it is always returned. The claims made
 * again run on the first transaction's connection (PostgreSQL; no wait for the pool), each wait for
 * keys is bounded by contendedKeyWait (past it the keys are skipped and no further claim is made),
 * and any error after a commit (a time limit, a reset connection) ends the claim with what was
 * committed: only the first transaction's error is the claim's. Otherwise its stages would stay
 * leased to this owner, never run, until their leases expired (an attempt spent each).
 */
async function claimLimitedThenCursor(db: Db, c: ClaimOf, limits: z.output<typeof claimLimitsSchema>): Promise<Row[]> {
  const cursors = keyCursors.get(db) ?? new Map<string, string>();
  keyCursors.set(db, cursors);
  const out: Row[] = [];
  let committed = false;
  const attempts = async (inTx: <T>(fn: (tx: Queryable) => Promise<T>) => Promise<T>): Promise<void> => {
    let waitKeys: string[] = [];
    for (let i = 0; i <= CONTENDED_RETRIES && out.length < c.limit; i++) {
      const { rows, cursor, contended, waitTimedOut } = await inTx((tx) =>
        claimLimited(tx, cursors.get(c.toolClass) ?? '', { ...c, limit: c.limit - out.length }, limits, waitKeys),
      );
      committed = true;
      if (cursor !== null) cursors.set(c.toolClass, cursor);
      out.push(...rows);
      if (contended.length === 0 || waitTimedOut) break;
      waitKeys = contended;
    }
  };
  try {
    // PGlite has one connection shared by every caller: only its own transaction() keeps others' statements out.
    if (db.kind === 'postgres')
      await db.withConnection((conn) => attempts((fn) => transactionOn(conn, fn, { idleLimitMs: ROW_HOLDING_IDLE_LIMIT_MS })));
    else await attempts((fn) => db.transaction(fn));
  } catch (err) {
    if (!committed) throw err;
    // A claim made again failed (rolled back, or its outcome unknown like any claim's): the committed leases are returned.
  }
  return out;
}

async function claimLimited(
  tx: Queryable,
  from: string,
  c: ClaimOf,
  limits: z.output<typeof claimLimitsSchema>,
  /** Keys a previous attempt found held: waited for first, before the class lock and before any row is locked. */
  waitKeys: string[] = [],
): Promise<{ rows: Row[]; cursor: string | null; contended: string[]; waitTimedOut: boolean }> {
  let waitTimedOut = false;
  if (waitKeys.length > 0) {
    // Bounds every lock wait of this transaction (the keys, then the class lock and the run rows the claim updates).
    await tx.query(`SET LOCAL lock_timeout = ${Math.max(1, Math.round(contendedKeyWait.lockTimeoutMs))}`);
    await tx.query('SAVEPOINT ratchet_wait_keys');
    try {
      await tx.query(LOCK_KEYS_SQL, [[...waitKeys].sort()], 'ratchet_lock_keys');
      await tx.query('RELEASE SAVEPOINT ratchet_wait_keys');
    } catch (err) {
      if (codeOf(err) !== LOCK_NOT_AVAILABLE) throw err;
      // A key still held: skipped this time (the pick below try-locks it like any key, and takes those that are free).
      await tx.query('ROLLBACK TO SAVEPOINT ratchet_wait_keys');
      waitTimedOut = true;
    }
  }
  let budget = c.limit;
  if (limits.classConcurrency !== undefined || limits.rate) {
    await tx.query(LOCK_CLASS_SQL, [c.toolClass], 'ratchet_lock_class');
    if (limits.classConcurrency !== undefined) {
      const [r] = await tx.query(COUNT_RUNNING_CLASS_SQL, [c.toolClass], 'ratchet_count_running_class');
      budget = Math.min(budget, limits.classConcurrency - (r!.n as number));
    }
    if (limits.rate) {
      const [r] = await tx.query(COUNT_RATE_SQL, [c.toolClass, limits.rate.windowMs], 'ratchet_count_rate');
      budget = Math.min(budget, limits.rate.max - (r!.n as number));
    }
  }
  if (budget <= 0) return { rows: [], cursor: null, contended: [], waitTimedOut };
  const keyed = limits.keyed === true;
  const picked = await tx.query(
    pickCandidatesSql(budget, c.hashes.length, keyed, c.by),
    [c.owner, c.toolClass, c.hashes, from],
    `ratchet_pick_${budget}_${c.hashes.length}${keyed ? '_keyed' : ''}_${c.by}`,
  );
  const cursor = keyed ? ((picked[0]?.next_cursor as string | null) ?? '') : null;
  const cands = picked.filter((p) => p.id !== null);
  let chosen = cands;
  let contended: string[] = [];
  const wanted = [...new Set(cands.map((p) => p.concurrency_key as string | null).filter((k): k is string => k !== null))].sort();
  if (wanted.length > 0) {
    // Never waits on a key while holding the candidate rows (TRY_LOCK_KEYS_SQL): a key another claimer holds is skipped.
    const keys = (await tx.query(TRY_LOCK_KEYS_SQL, [wanted], 'ratchet_try_lock_keys')).map((r) => r.key as string).sort();
    contended = wanted.filter((k) => !keys.includes(k));
    const live = new Map<string, number>(keys.map((k) => [k, 0]));
    if (keys.length > 0) {
      for (const r of await tx.query(COUNT_RUNNING_KEYS_SQL, [keys], 'ratchet_count_running_keys'))
        live.set(r.key as string, r.n as number);
    }
    chosen = cands.filter((p) => {
      const key = p.concurrency_key as string | null;
      if (key === null) return true;
      if (!live.has(key)) return false; // its lock is held by another claimer
      const n = live.get(key)!;
      if (n >= (p.concurrency_limit as number)) return false;
      live.set(key, n + 1);
      return true;
    });
  }
  chosen = chosen.slice(0, budget);
  if (chosen.length === 0) return { rows: [], cursor, contended, waitTimedOut };
  const rows = await tx.query(CLAIM_IDS_SQL, [c.owner, chosen.map((p) => p.id as string)], 'ratchet_claim_ids');
  const started = rows.filter((r) => r.state === 'running').length;
  if (limits.rate && started > 0) await tx.query(RECORD_RATE_SQL, [c.toolClass, started], 'ratchet_record_rate');
  return { rows, cursor, contended, waitTimedOut };
}
