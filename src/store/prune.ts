import ms from 'ms';
import { z } from 'zod';
import type { Queryable } from './db.js';
import { PRUNE_BATCH_SQL, PRUNE_COUNT_SQL, PRUNE_TICKS_BATCH_SQL } from './prune.sql.js';
import { parseInput } from './validate.js';

/** The states a run ends in: the only ones retention ever deletes. */
export const FINISHED_RUN_STATES = ['succeeded', 'failed', 'cancelled', 'expired'] as const;
export type FinishedRunState = (typeof FINISHED_RUN_STATES)[number];

/** Runs deleted per batch by default: one batch is one short statement (runs, their stages and events). */
export const DEFAULT_PRUNE_BATCH = 500;
export const MAX_PRUNE_BATCH = 10_000;
/** Events deleted per batch at most by default: a batch of runs with long histories is cut to fit (and one huge run is emptied in steps). */
export const DEFAULT_PRUNE_BATCH_EVENTS = 50_000;
export const MAX_PRUNE_BATCH_EVENTS = 1_000_000;
/** The longest age accepted (100 years): an age is compared in SQL, not given to a timer, so it may pass setTimeout's 24.8 days. */
const MAX_AGE_MS = 100 * 365.25 * 24 * 3600 * 1000;

/** An age: an ms string ("30d", "12h", "2w") or whole milliseconds, greater than 0. */
export const ageSchema = z.union([z.string(), z.number()]).transform((value, ctx): number => {
  let n: number | undefined;
  try {
    n = typeof value === 'number' ? value : (ms(value.trim() as ms.StringValue) as number | undefined);
  } catch {
    n = undefined;
  }
  const problem =
    typeof n !== 'number' || !Number.isFinite(n)
      ? `cannot read ${JSON.stringify(value)} as an age: expected an ms string like "30d" or milliseconds`
      : !Number.isInteger(n) || n <= 0
        ? `the age ${JSON.stringify(value)} must be a whole number of milliseconds greater than 0`
        : n > MAX_AGE_MS
          ? `the age ${JSON.stringify(value)} is more than 100 years`
          : null;
  if (problem) {
    ctx.issues.push({ code: 'custom', message: problem, input: value });
    return z.NEVER;
  }
  return n!;
});

/**
 * A retention policy: how long runs are kept after they finish, per finished state
 * (`{ succeeded: '7d', failed: '30d' }`); a state not named is kept for ever.
 */
export const retentionPolicySchema = z
  .object({
    succeeded: ageSchema.optional(),
    failed: ageSchema.optional(),
    cancelled: ageSchema.optional(),
    expired: ageSchema.optional(),
  })
  .strict();
export type RetentionPolicy = z.input<typeof retentionPolicySchema>;
/** A policy read: milliseconds per finished state. */
export type RetentionAges = z.output<typeof retentionPolicySchema>;

export interface PruneCounts {
  runs: number;
  stages: number;
  events: number;
}

export interface PruneBatch extends PruneCounts {
  state: FinishedRunState;
  /** 1 for the first batch of this prune. */
  batch: number;
}

const pruneOptionsSchema = z
  .object({
    /** How long after finishing, per finished state (a retention policy: `{ succeeded: '7d' }`); states not named are not touched. */
    olderThan: retentionPolicySchema,
    /** Runs per batch (default 500). */
    batchSize: z.number().int().min(1).max(MAX_PRUNE_BATCH).default(DEFAULT_PRUNE_BATCH),
    /** Events per batch at most (default 50,000): the runs of a batch go while their events fit. */
    batchEvents: z.number().int().min(1).max(MAX_PRUNE_BATCH_EVENTS).default(DEFAULT_PRUNE_BATCH_EVENTS),
    /** At most this many batches per state (the sweeper's bound per tick); default: until none is left. */
    maxBatchesPerState: z.number().int().positive().optional(),
    /** Count what would go; delete nothing. */
    dryRun: z.boolean().default(false),
    /** Called after each committed batch (progress, tests); the next batch waits for it. */
    onBatch: z.custom<(batch: PruneBatch) => void | Promise<void>>((v) => typeof v === 'function').optional(),
  })
  .strict();
export type PruneOptions = z.input<typeof pruneOptionsSchema>;

export interface PruneResult extends PruneCounts {
  dryRun: boolean;
  /** Statements that deleted (0 for a dry run). */
  batches: number;
  /** False when maxBatchesPerState stopped a state with runs possibly left to prune. */
  complete: boolean;
  byState: Partial<Record<FinishedRunState, PruneCounts>>;
}

const counts = (r: Record<string, unknown> | undefined): PruneCounts => ({
  runs: Number(r?.runs ?? 0),
  stages: Number(r?.stages ?? 0),
  events: Number(r?.events ?? 0),
});

/**
 * Deletes finished runs older than their state's age (by the database clock), with their stages
 * and events, one bounded batch per statement; never a run that is not finished (the SQL
 * checks the state, under the run's row lock). Each batch is bounded in runs (`batchSize`)
 * and in events (`batchEvents`). A state's batches stop at the first batch that locked fewer than
 * `batchSize` runs and left none for the events bound (nothing left, or the rest is locked by someone else right now).
 */
export async function prune(q: Queryable, options: PruneOptions): Promise<PruneResult> {
  const o = parseInput(pruneOptionsSchema, options, 'prune');
  const result: PruneResult = { dryRun: o.dryRun, runs: 0, stages: 0, events: 0, batches: 0, complete: true, byState: {} };
  const add = (state: FinishedRunState, c: PruneCounts) => {
    const s = (result.byState[state] ??= { runs: 0, stages: 0, events: 0 });
    for (const k of ['runs', 'stages', 'events'] as const) {
      s[k] += c[k];
      result[k] += c[k];
    }
  };
  for (const state of FINISHED_RUN_STATES) {
    const age = o.olderThan[state];
    if (age === undefined) continue;
    if (o.dryRun) {
      add(state, counts((await q.query(PRUNE_COUNT_SQL, [state, age]))[0]));
      continue;
    }
    for (let n = 1; ; n++) {
      if (o.maxBatchesPerState !== undefined && n > o.maxBatchesPerState) {
        result.complete = false;
        break;
      }
      const [row] = await q.query(PRUNE_BATCH_SQL, [state, age, o.batchSize, o.batchEvents], 'ratchet_prune_batch');
      const c = counts(row);
      result.batches++;
      add(state, c);
      await o.onBatch?.({ state, batch: result.batches, ...c });
      // More to do: the batch was full of runs, or the events bound left some of them (or part of one run's events) for the next.
      if (Number(row?.locked ?? 0) < o.batchSize && Number(row?.deferred ?? 0) === 0) break;
    }
  }
  return result;
}

/** The latest ticks kept per schedule by the tick pass, whatever their runs (what `ratchet schedules` / GET show). */
export const TICKS_KEPT_PER_SCHEDULE = 100;
/** Tick rows deleted per batch at most. */
export const DEFAULT_TICK_PRUNE_BATCH = 1000;

export interface PruneTicksOptions {
  /** Latest ticks kept per schedule (default TICKS_KEPT_PER_SCHEDULE). */
  keep?: number;
  /** Rows per batch (default DEFAULT_TICK_PRUNE_BATCH). */
  batchSize?: number;
  /** At most this many batches (the sweeper's bound per tick); default: until none is left. */
  maxBatches?: number;
}

/**
 * Deletes schedule tick rows nothing needs any more (PRUNE_TICKS_BATCH_SQL): those of deleted
 * schedules, and decided ticks whose run is gone, older than the latest `keep` of their schedule.
 * One bounded statement per batch; stops at the first batch that found fewer than a batch's worth.
 */
export async function pruneScheduleTicks(
  q: Queryable,
  options: PruneTicksOptions = {},
): Promise<{ ticks: number; batches: number; complete: boolean }> {
  const keep = options.keep ?? TICKS_KEPT_PER_SCHEDULE;
  const batchSize = options.batchSize ?? DEFAULT_TICK_PRUNE_BATCH;
  if (!Number.isInteger(keep) || keep < 0 || !Number.isInteger(batchSize) || batchSize < 1) {
    throw new RangeError(`pruneScheduleTicks: keep ${keep} and batchSize ${batchSize} must be whole numbers (batchSize > 0)`);
  }
  let ticks = 0;
  for (let n = 1; ; n++) {
    if (options.maxBatches !== undefined && n > options.maxBatches) return { ticks, batches: n - 1, complete: false };
    const [row] = await q.query(PRUNE_TICKS_BATCH_SQL, [keep, batchSize], 'ratchet_prune_ticks_batch');
    ticks += Number(row?.ticks ?? 0);
    if (Number(row?.found ?? 0) < batchSize) return { ticks, batches: n, complete: true };
  }
}
