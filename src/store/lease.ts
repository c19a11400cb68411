import { performance } from 'node:perf_hooks';
import { z } from 'zod';
import { InvalidInputError } from '../errors.js';
import { canTransition } from '../planner/states.js';
import type { Db, Queryable, Row } from './db.js';
import { toJsonTextOrNull } from './json.js';
import {
  CLAIM_IDS_SQL, claimSql, COUNT_RATE_SQL, COUNT_RUNNING_CLASS_SQL, COUNT_RUNNING_KEYS_SQL, EXTEND_SQL, FINISH_SQL, LOCK_CLASS_SQL,
  LOCK_KEYS_SQL, pickCandidatesSql, RECORD_RATE_SQL, RELEASE_SQL,
} from './lease.sql.js';
import { parseInput } from './validate.js';

/**
 * Timer lateness covered by the local confirmation deadline: a lease is trusted until
 * sent + (lease_until - db now) - LEASE_CONFIRMATION_MARGIN_MS, never longer.
 */
export const LEASE_CONFIRMATION_MARGIN_MS = 500;

/** The monotonic clock the confirmation deadline is measured on. */
export const monotonicNow = (): number => performance.now();

const confirmedUntil = (sentAt: number, leaseUntil: Date, dbNow: Date): number =>
  sentAt + (leaseUntil.getTime() - dbNow.getTime()) - LEASE_CONFIRMATION_MARGIN_MS;

export interface Lease { stageId: string; fence: string }

export interface ClaimedStage {
  id: string;
  runId: string;
  seq: number;
  name: string;
  tool: string;
  toolClass: string;
  /** 'running' for a claim; 'failed' when the claim found the attempt budget spent. */
  state: 'running' | 'failed';
  fence: string;
  attempt: number;
  maxAttempts: number;
  input: unknown;
  idempotencyKey: string;
  leaseUntil: Date;
  leaseMs: number;
  timeoutMs: number;
  maxDurationMs: number;
  claimedAt: Date;
  firstClaimedAt: Date;
  error: unknown;
  /** 'running' when this claim took over an expired lease (a reclaim). */
  previousState: 'queued' | 'running';
  previousFence: string | null;
  dbNow: Date;
  /** The run's workflow, the hash of the definition it started with, its input and deadline. */
  workflow: string;
  definitionHash: string;
  runInput: unknown;
  runDeadline: Date | null;
  /** Monotonic time (performance.now()) until which this worker may trust the lease. */
  confirmedUntil: number;
}

export const claimLimitsSchema = z.object({
  /** At most this many stages of the class hold a live lease at once, across all workers. */
  classConcurrency: z.number().int().min(1).max(100_000).optional(),
  /** At most `max` claims of the class start in any window of `windowMs`, across all workers. */
  rate: z.object({ max: z.number().int().min(1).max(1_000_000), windowMs: z.number().int().min(1).max(2 ** 31 - 1) }).strict().optional(),
  /** The class has stages under concurrency keys: count live leases per key before claiming. */
  keyed: z.boolean().optional(),
}).strict();
export type ClaimLimits = z.input<typeof claimLimitsSchema>;

const claimArgs = z.object({
  owner: z.string().min(1).max(200),
  toolClass: z.string().min(1).max(200),
  limit: z.number().int().min(1).max(1000),
  limits: claimLimitsSchema.optional(),
}).strict();

/**
 * Claims up to `limit` due stages of one tool class. Without limits: one atomic statement
 * (stages under a concurrency key are left alone). With limits: one short transaction that
 * serialises the class's claims (advisory lock), counts live leases and the rate window by
 * the database clock, locks the candidates' concurrency keys in sorted order and counts their
 * live leases, then claims only what fits — so the limits hold whatever the number of workers
 * and whichever path woke them. Rows with state 'failed' are stages whose attempt budget was
 * spent (not claimed).
 */
export async function claim(db: Db, args: z.input<typeof claimArgs>): Promise<ClaimedStage[]> {
  const { owner, toolClass, limit, limits } = parseInput(claimArgs, args, 'claim');
  const sentAt = monotonicNow(); // read before asking the pool for a connection
  const limited = limits && (limits.classConcurrency !== undefined || limits.rate !== undefined || limits.keyed);
  const rows = limited
    ? await db.transaction((tx) => claimLimited(tx, owner, toolClass, limit, limits))
    : await db.query(claimSql(limit), [owner, toolClass], `ratchet_claim_${limit}`);
  return rows.map((r) => toClaimed(r, sentAt));
}

async function claimLimited(tx: Queryable, owner: string, toolClass: string, limit: number, limits: z.output<typeof claimLimitsSchema>): Promise<Row[]> {
  let budget = limit;
  if (limits.classConcurrency !== undefined || limits.rate) {
    await tx.query(LOCK_CLASS_SQL, [toolClass], 'ratchet_lock_class');
    if (limits.classConcurrency !== undefined) {
      const [r] = await tx.query(COUNT_RUNNING_CLASS_SQL, [toolClass], 'ratchet_count_running_class');
      budget = Math.min(budget, limits.classConcurrency - (r!.n as number));
    }
    if (limits.rate) {
      const [r] = await tx.query(COUNT_RATE_SQL, [toolClass, limits.rate.windowMs], 'ratchet_count_rate');
      budget = Math.min(budget, limits.rate.max - (r!.n as number));
    }
  }
  if (budget <= 0) return [];
  // Keyed stages may be skipped for their key's limit: look a little further than the budget.
  const window = Math.min(1000, limits.keyed ? budget * 4 : budget);
  const cands = await tx.query(pickCandidatesSql(window), [owner, toolClass], `ratchet_pick_${window}`);
  let chosen = cands;
  const keys = [...new Set(cands.map((c) => c.concurrency_key as string | null).filter((k): k is string => k !== null))].sort();
  if (keys.length > 0) {
    await tx.query(LOCK_KEYS_SQL, [keys], 'ratchet_lock_keys');
    const live = new Map((await tx.query(COUNT_RUNNING_KEYS_SQL, [keys], 'ratchet_count_running_keys')).map((r) => [r.key as string, r.n as number]));
    chosen = cands.filter((c) => {
      const key = c.concurrency_key as string | null;
      if (key === null) return true;
      const n = live.get(key) ?? 0;
      if (n >= (c.concurrency_limit as number)) return false;
      live.set(key, n + 1);
      return true;
    });
  }
  chosen = chosen.slice(0, budget);
  if (chosen.length === 0) return [];
  const rows = await tx.query(CLAIM_IDS_SQL, [owner, chosen.map((c) => c.id as string)], 'ratchet_claim_ids');
  const started = rows.filter((r) => r.state === 'running').length;
  if (limits.rate && started > 0) await tx.query(RECORD_RATE_SQL, [toolClass, started], 'ratchet_record_rate');
  return rows;
}

/** A claim row as the worker sees it, with its local confirmation deadline. */
export function toClaimed(r: Row, sentAt: number): ClaimedStage {
  const leaseUntil = r.lease_until as Date;
  const dbNow = r.db_now as Date;
  return {
    id: r.id as string,
    runId: r.run_id as string,
    seq: r.seq as number,
    name: r.name as string,
    tool: r.tool as string,
    toolClass: r.tool_class as string,
    state: r.state as 'running' | 'failed',
    fence: r.fence as string,
    attempt: r.attempt as number,
    maxAttempts: r.max_attempts as number,
    input: r.input,
    idempotencyKey: r.idempotency_key as string,
    leaseUntil,
    leaseMs: r.lease_ms as number,
    timeoutMs: r.timeout_ms as number,
    maxDurationMs: r.max_duration_ms as number,
    claimedAt: r.claimed_at as Date,
    firstClaimedAt: r.first_claimed_at as Date,
    error: r.error,
    previousState: r.prev_state as 'queued' | 'running',
    previousFence: (r.prev_fence as string | null) ?? null,
    dbNow,
    workflow: r.workflow as string,
    definitionHash: r.definition_hash as string,
    runInput: r.run_input,
    runDeadline: (r.run_deadline as Date | null) ?? null,
    confirmedUntil: r.state === 'running' ? confirmedUntil(sentAt, leaseUntil, dbNow) : sentAt,
  };
}

export type ExtendVerdict = 'extended' | 'duration_exceeded' | 'cancelled' | 'lost';
export interface ExtendResult {
  stageId: string;
  fence: string;
  verdict: ExtendVerdict;
  /** The row's state now (null when the row is gone). */
  state: string | null;
  leaseUntil: Date | null;
  dbNow: Date;
  /** For 'extended': the new local confirmation deadline (monotonic ms). */
  confirmedUntil: number | null;
}

const leasesArgs = z.object({
  owner: z.string().min(1).max(200),
  leases: z.array(z.object({ stageId: z.string().regex(/^\d{1,19}$/), fence: z.string().regex(/^\d{1,19}$/) }).strict()).max(10_000),
}).strict();

/**
 * Extends all of one owner's leases in one statement. A missing row means lost; a statement
 * that throws means *unknown* (the caller keeps its old deadline), never lost.
 */
export async function extend(q: Queryable, args: z.input<typeof leasesArgs>): Promise<ExtendResult[]> {
  const { owner, leases } = parseInput(leasesArgs, args, 'extend');
  if (leases.length === 0) return [];
  const sentAt = monotonicNow();
  const rows = await q.query(EXTEND_SQL, [owner, leases.map((l) => l.stageId), leases.map((l) => l.fence)], 'ratchet_extend');
  return rows.map((r) => {
    const verdict = r.verdict as ExtendVerdict;
    const leaseUntil = (r.lease_until as Date | null) ?? null;
    const dbNow = r.db_now as Date;
    return {
      stageId: r.id as string,
      fence: r.fence as string,
      verdict,
      state: (r.state as string | null) ?? null,
      leaseUntil,
      dbNow,
      confirmedUntil: verdict === 'extended' && leaseUntil ? confirmedUntil(sentAt, leaseUntil, dbNow) : null,
    };
  });
}

const json = z.unknown();
const finishRow = z.object({
  stageId: z.string().regex(/^\d{1,19}$/),
  fence: z.string().regex(/^\d{1,19}$/),
  outcome: z.enum(['succeeded', 'failed', 'queued', 'cancelled']),
  result: json.optional(),
  error: json.optional(),
  retryDelayMs: z.number().int().min(0).max(2 ** 31 - 1).optional(),
  next: z.object({ seq: z.number().int().min(1), input: json }).strict().optional(),
  /** The fast path: claim the next stage for this owner in the same statement (unkeyed stages only). */
  claimNext: z.boolean().optional(),
  /** Queue the next stage with the input it already holds (an agent's planned tool call). */
  nextKeepInput: z.boolean().optional(),
  /** An agent's plan: new stages inserted with this finish (the first `queued`, the rest `pending`). */
  plan: z.array(z.object({
    seq: z.number().int().min(1), name: z.string().min(1).max(200), tool: z.string().min(1).max(200), toolClass: z.string().min(1).max(200),
    state: z.enum(['queued', 'pending']), leaseMs: z.number().int().positive(), timeoutMs: z.number().int().positive(),
    maxDurationMs: z.number().int().positive(), maxAttempts: z.number().int().min(1), input: json,
    concurrencyKey: z.string().optional(), concurrencyLimit: z.number().int().min(1).optional(),
  }).strict()).min(1).max(1000).optional(),
  run: z.object({ state: z.enum(['succeeded', 'failed', 'expired', 'cancelled']), result: json.optional(), error: json.optional() }).strict().optional(),
  /** Extra event data (ids, hashes, durations; never payloads). */
  data: z.record(z.string(), json).optional(),
}).strict();
export type FinishRow = z.input<typeof finishRow>;

export interface FinishVerdict {
  stageId: string;
  accepted: boolean;
  /** The stage queued next by this finish, if any (to wake a worker of its class). */
  nextStageId: string | null;
  nextToolClass: string | null;
  currentState: string | null;
  currentFence: string | null;
  /** On the fast path: the next stage, already claimed by this owner. */
  nextClaimed: ClaimedStage | null;
}

const DATE_FIELDS = ['lease_until', 'claimed_at', 'first_claimed_at', 'db_now', 'run_deadline'] as const;

/** Serialises one finish row; throws InvalidInputError for that row alone. */
export function encodeFinishRow(input: FinishRow, path = 'finish'): Record<string, unknown> {
  const row = parseInput(finishRow, input, path);
  if (!canTransition('stage', 'running', row.outcome)) throw new InvalidInputError(`outcome ${row.outcome} is not a legal end of a running stage`, `${path}.outcome`);
  if (row.outcome === 'queued' && row.retryDelayMs === undefined) throw new InvalidInputError('a retry needs retryDelayMs', `${path}.retryDelayMs`);
  if (row.run && row.next) throw new InvalidInputError('a finish cannot both queue a next stage and end the run', `${path}.run`);
  const parse = (v: unknown, at: string) => (toJsonTextOrNull(v, at) === null ? null : v);
  return {
    id: row.stageId,
    fence: row.fence,
    outcome: row.outcome,
    result: parse(row.result, `${path}.result`),
    error: parse(row.error, `${path}.error`),
    retryDelayMs: row.retryDelayMs ?? null,
    nextSeq: row.next?.seq ?? null,
    nextInput: row.next ? parse(row.next.input, `${path}.next.input`) : null,
    claimNext: row.next ? row.claimNext ?? false : false,
    nextKeepInput: row.next ? row.nextKeepInput ?? false : false,
    plan: row.plan ? row.plan.map((p, i) => ({ ...p, input: parse(p.input, `${path}.plan[${i}].input`) })) : null,
    runState: row.run?.state ?? null,
    runResult: row.run ? parse(row.run.result, `${path}.run.result`) : null,
    runError: row.run ? parse(row.run.error, `${path}.run.error`) : null,
    data: parse(row.data, `${path}.data`),
  };
}

/**
 * Finishes attempts of one owner in one statement, each row fenced on its own, each with its
 * dispatcher decision. Rows must already be encoded (encodeFinishRow) so one bad row cannot
 * sink a batch. A rejected row leaves a `result_rejected` event and changes nothing.
 */
export async function finishEncoded(q: Queryable, owner: string, rows: Record<string, unknown>[]): Promise<FinishVerdict[]> {
  if (rows.length === 0) return [];
  const sorted = [...rows].sort((a, b) => (BigInt(a.id as string) < BigInt(b.id as string) ? -1 : 1));
  const sentAt = monotonicNow();
  const out = await q.query(FINISH_SQL, [owner, JSON.stringify(sorted), sorted.map((r) => r.id as string)], 'ratchet_finish');
  return out.map((r) => ({
    stageId: r.id as string,
    accepted: r.accepted as boolean,
    nextStageId: (r.next_stage_id as string | null) ?? null,
    nextToolClass: (r.next_tool_class as string | null) ?? null,
    currentState: (r.current_state as string | null) ?? null,
    currentFence: (r.current_fence as string | null) ?? null,
    nextClaimed: r.next_claimed ? toClaimed(reviveDates(r.next_claimed as Row), sentAt) : null,
  }));
}

/** to_jsonb() turns timestamps into strings: back to Dates for the claim row. */
function reviveDates(row: Row): Row {
  const out: Row = { ...row };
  for (const f of DATE_FIELDS) if (typeof out[f] === 'string') out[f] = new Date(out[f] as string);
  return out;
}

/** Validates and finishes; throws InvalidInputError (nothing written) when any row is bad. */
export async function finish(q: Queryable, owner: string, rows: FinishRow[]): Promise<FinishVerdict[]> {
  parseInput(z.string().min(1).max(200), owner, 'finish.owner');
  const encoded = rows.map((r, i) => encodeFinishRow(r, `finish[${i}]`));
  return finishEncoded(q, owner, encoded);
}

/** Graceful shutdown: hands leases back at once. Returns the ids actually released. */
export async function release(q: Queryable, args: z.input<typeof leasesArgs>): Promise<{ stageId: string; toolClass: string }[]> {
  const { owner, leases } = parseInput(leasesArgs, args, 'release');
  if (leases.length === 0) return [];
  const rows = await q.query(RELEASE_SQL, [owner, leases.map((l) => l.stageId), leases.map((l) => l.fence)], 'ratchet_release');
  return rows.map((r) => ({ stageId: r.id as string, toolClass: r.tool_class as string }));
}
