import { join, resolve } from 'node:path';
import type { Logger } from 'pino';
import { z } from 'zod';
import type { StageState } from '../planner/states.js';
import type { Db } from './db.js';
import { createPgliteDb } from './db-pglite.js';
import { createPostgresDb } from './db-postgres.js';
import { claim } from './claim.js';
import { extend, extenderOn, release, type Extender } from './extend.js';
import { expireRun, expireRuns, sweepOrphans } from './deadline.js';
import { EXPIRE_ALL_LEASES_SQL } from './extend.sql.js';
import { finish, type FinishRow } from './finish.js';
import { appendEvents, effectStarted, runStages, stageResults, type NewEvent } from './events.js';
import {
  deleteWorker,
  dueIn,
  failUnserved,
  nextLeaseExpiryMs,
  sweep,
  unservedClasses,
  upsertWorker,
  type Lane,
  type SweptStage,
} from './workers.js';
import { acquireDataDirLock } from './lockfile.js';
import { cancelRun, childRun, createRun, getRun, graphStages, listEvents, transitionStage, type CreateRunInput } from './runs.js';
import { GET_CLOCK_SQL, SET_CLOCK_OFFSET_SQL } from './runs.sql.js';
import { parseInput } from './validate.js';
import { retryRun } from './retry-run.js';
import { retryWhileUnavailable } from './startup-wait.js';
import { listRuns, type ListRunsFilter } from './list-runs.js';
import { prune, type PruneOptions } from './prune.js';

export { DatabaseUnavailableError, classifyDbError, type DbErrorKind } from './db-errors.js';
export type { Db, DbSession, QueryOptions, Queryable } from './db.js';
export { StatementTimeLimitError } from './db.js';
export { LEASE_CONFIRMATION_MARGIN_MS, monotonicNow } from './lease.js';
export { encodeFinishRow, FinishPartlyCommitted, finishEncoded } from './finish.js';
export type { ClaimedStage, ExtendLease, Lease } from './lease.js';
export type { Extender, ExtendResult, ExtendVerdict } from './extend.js';
export type { ExpiredRuns } from './deadline.js';
export type { FinishRow, FinishVerdict } from './finish.js';
export { IdempotencyConflictError, requestHash, stageRows, stageSpecSchema } from './runs.js';
export type { NewEvent, RunStageRow } from './events.js';
export type { Lane, SweptStage } from './workers.js';
export { LIVE_WORKER_MS } from './workers.js';
export type { ClaimLimits } from './claim.js';
export { MAX_CLAIM_DEFINITIONS } from './claim.sql.js';
export type {
  CancelResult,
  CreateRunInput,
  CreatedRun,
  EventRow,
  RunRow,
  StageRow,
  StageSpec,
  GraphStageRow,
  ChildRunSummary,
} from './runs.js';
export type { RetryResult } from './retry-run.js';
export { MAX_LIST_LIMIT } from './list-runs.js';
export type { ListRunsFilter, RunPage, RunSummaryRow } from './list-runs.js';
export { FINISHED_RUN_STATES, DEFAULT_PRUNE_BATCH, MAX_PRUNE_BATCH, ageSchema, retentionPolicySchema } from './prune.js';
export type { FinishedRunState, PruneBatch, PruneCounts, PruneOptions, PruneResult, RetentionAges, RetentionPolicy } from './prune.js';

/** The embedded default's data directory, relative to the working directory. */
export const DEFAULT_DATA_DIR = '.ratchet';
/** An in-memory embedded database (tests, one-shot runs): no lock file, nothing kept. */
export const MEMORY_DATA_DIR = ':memory:';

const storeOptions = z
  .object({
    /** postgres://... selects the PostgreSQL back end; unset selects embedded PGlite. */
    databaseUrl: z.string().min(1).optional(),
    /** Embedded data directory (default .ratchet/), or ':memory:'. */
    dataDir: z.string().min(1).optional(),
    /** PostgreSQL pool size (default 10). */
    poolSize: z.number().int().min(1).max(1000).optional(),
    /** Apply migrations at open (default true). */
    migrate: z.boolean().optional(),
    applicationName: z.string().optional(),
    connectionTimeoutMs: z.number().int().positive().optional(),
    /** Client-side limit on one statement's answer (default 10 s); see db-postgres.ts. */
    queryTimeoutMs: z.number().int().positive().optional(),
    /** How long opening waits for a database that does not answer, trying again (default 30 s; 0 tries once). See startup-wait.ts. */
    startupWaitMs: z.number().int().min(0).optional(),
    logger: z.custom<Logger>().optional(),
  })
  .strict();
export type StoreOptions = z.input<typeof storeOptions>;

export interface Store {
  readonly db: Db;
  readonly kind: Db['kind'];
  readonly dataDir: string | null;
  createRun(input: CreateRunInput): ReturnType<typeof createRun>;
  getRun(id: string): ReturnType<typeof getRun>;
  listEvents(runId: string, opts?: { after?: string; limit?: number }): ReturnType<typeof listEvents>;
  transitionStage(stageId: string, to: StageState): Promise<void>;
  cancelRun(runId: string): ReturnType<typeof cancelRun>;
  appendEvents(events: NewEvent[]): Promise<void>;
  effectStarted(runId: string, stageId: string, beforeFence: string): Promise<boolean>;
  stageResults(runId: string): Promise<Record<string, unknown>>;
  runStages(runId: string): ReturnType<typeof runStages>;
  /** A run's stages with results and errors, for the planner at a claim (runs.ts). */
  graphStages(runId: string): ReturnType<typeof graphStages>;
  /** The child run a stage started, if any (runs.ts). */
  childRun(stageId: string): ReturnType<typeof childRun>;
  /** Answers the workers seen within `liveWithinMs` (default LIVE_WORKER_MS), this one included. */
  upsertWorker(owner: string, classes: string[], definitions: string[], liveWithinMs?: number): Promise<number>;
  deleteWorker(owner: string): Promise<void>;
  /** Due stages to re-send: queued ones once they have waited `graceMs` (default 0) in that state, and expired leases. */
  sweep(lanes: Lane[], limit: number, graceMs?: number): Promise<SweptStage[]>;
  /** Milliseconds until the first live lease of these lanes expires (0: already); null when none runs. */
  nextLeaseExpiryMs(lanes: Lane[]): Promise<number | null>;
  dueIn(stageId: string): Promise<number>;
  unservedClasses(classes: string[], withinMs: number): Promise<string[]>;
  failUnserved(classes: string[], afterMs: number): Promise<number>;
  claim(args: Parameters<typeof claim>[1]): ReturnType<typeof claim>;
  extend(args: Parameters<typeof extend>[1], opts?: Parameters<typeof extend>[2]): ReturnType<typeof extend>;
  /** An extender on a connection of its own, outside the pool (one per lease keeper); close() ends it. */
  openExtender(): Extender;
  /** Expires at most `limit` runs past their deadline (the sweeper; deadline.sql.ts). */
  expireRuns(limit: number): ReturnType<typeof expireRuns>;
  /** Expires one run if its deadline has passed (a claim found it so first: the executor). */
  expireRun(runId: string): ReturnType<typeof expireRun>;
  /** Child runs left active under an ended parent, cancelled (the sweeper's orphan pass). */
  sweepOrphans(limit: number): ReturnType<typeof sweepOrphans>;
  finish(owner: string, rows: FinishRow[]): ReturnType<typeof finish>;
  release(args: Parameters<typeof release>[1]): ReturnType<typeof release>;
  /** The movable database clock (tests): every connection and process reads it. */
  clock: {
    now(): Promise<Date>;
    offsetMs(): Promise<number>;
    setOffset(ms: number): Promise<void>;
    advance(ms: number): Promise<void>;
  };
  close(): Promise<void>;
  /** Retries a failed run from its failed stages with a fresh attempt budget; null for an unknown id. */
  retryRun(runId: string): ReturnType<typeof retryRun>;
  /** One page of runs, newest first, with filters and a keyset cursor. */
  listRuns(filter?: ListRunsFilter): ReturnType<typeof listRuns>;
  /** Deletes finished runs past their state's age, with their stages and events, in bounded batches (./prune.ts). */
  prune(options: PruneOptions): ReturnType<typeof prune>;
}

/**
 * Opens the store: PostgreSQL when a database URL is given, else embedded PGlite in a data
 * directory guarded by a lock file. Applies migrations (under an advisory lock). On the
 * embedded store, leases left by a dead process are expired at once so they are reclaimed.
 */
export async function openStore(options: StoreOptions = {}): Promise<Store> {
  const opts = parseInput(storeOptions, options, 'openStore');
  let db: Db;
  let releaseLock: (() => void) | undefined;
  let dataDir: string | null = null;
  if (opts.databaseUrl) {
    db = createPostgresDb({
      connectionString: opts.databaseUrl,
      max: opts.poolSize,
      applicationName: opts.applicationName,
      connectionTimeoutMs: opts.connectionTimeoutMs,
      queryTimeoutMs: opts.queryTimeoutMs,
    });
  } else if (opts.dataDir === MEMORY_DATA_DIR) {
    db = await createPgliteDb(undefined);
  } else {
    dataDir = resolve(opts.dataDir ?? DEFAULT_DATA_DIR);
    releaseLock = acquireDataDirLock(dataDir);
    try {
      db = await createPgliteDb(join(dataDir, 'pg'));
    } catch (err) {
      releaseLock();
      throw err;
    }
  }
  try {
    if (opts.migrate !== false)
      await retryWhileUnavailable('migrations', () => db.migrate(), { waitMs: opts.startupWaitMs, logger: opts.logger });
    if (db.kind === 'pglite') {
      const [r] = await db.query(EXPIRE_ALL_LEASES_SQL);
      if (r && (r.expired as number) > 0)
        opts.logger?.info({ event: 'lease_expired_at_startup', count: r.expired }, 'expired leases left by a previous process');
    }
  } catch (err) {
    await db.close().catch(() => {});
    releaseLock?.();
    throw err;
  }

  const setOffset = async (ms: number) => {
    parseInput(
      z
        .number()
        .int()
        .min(-(2 ** 40))
        .max(2 ** 40),
      ms,
      'clock.setOffset',
    );
    await db.query(SET_CLOCK_OFFSET_SQL, [ms]);
  };
  const offsetMs = async () => Number((await db.query(GET_CLOCK_SQL))[0]?.offset_ms ?? 0);
  let closed = false;
  return {
    db,
    kind: db.kind,
    dataDir,
    createRun: (input) => createRun(db, input),
    getRun: (id) => getRun(db, id),
    listEvents: (runId, o) => listEvents(db, runId, o),
    transitionStage: (stageId, to) => transitionStage(db, stageId, to),
    cancelRun: (runId) => cancelRun(db, runId),
    appendEvents: (events) => appendEvents(db, events),
    effectStarted: (runId, stageId, beforeFence) => effectStarted(db, runId, stageId, beforeFence),
    stageResults: (runId) => stageResults(db, runId),
    runStages: (runId) => runStages(db, runId),
    graphStages: (runId) => graphStages(db, runId),
    childRun: (stageId) => childRun(db, stageId),
    upsertWorker: (owner, classes, definitions, liveWithinMs) => upsertWorker(db, owner, classes, definitions, liveWithinMs),
    deleteWorker: (owner) => deleteWorker(db, owner),
    sweep: (lanes, limit, graceMs) => sweep(db, lanes, limit, graceMs),
    nextLeaseExpiryMs: (lanes) => nextLeaseExpiryMs(db, lanes),
    dueIn: (stageId) => dueIn(db, stageId),
    unservedClasses: (classes, withinMs) => unservedClasses(db, classes, withinMs),
    failUnserved: (classes, afterMs) => failUnserved(db, classes, afterMs),
    claim: (args) => claim(db, args),
    extend: (args, o) => extend(db, args, o),
    openExtender: () => extenderOn(db.session('lease-keeper')),
    expireRuns: (limit) => expireRuns(db, limit),
    expireRun: (runId) => expireRun(db, runId),
    sweepOrphans: (limit) => sweepOrphans(db, limit),
    finish: (owner, rows) => finish(db, owner, rows),
    release: (args) => release(db, args),
    clock: {
      now: async () => (await db.query(GET_CLOCK_SQL))[0]?.now as Date,
      offsetMs,
      setOffset,
      advance: async (ms) => setOffset((await offsetMs()) + ms),
    },
    retryRun: (runId) => retryRun(db, runId),
    listRuns: (filter) => listRuns(db, filter),
    prune: (options) => prune(db, options),
    async close() {
      if (closed) return;
      closed = true;
      try {
        await db.close();
      } finally {
        releaseLock?.();
      }
    },
  };
}
