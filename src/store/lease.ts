import { performance } from 'node:perf_hooks';
import { z } from 'zod';
import { InvalidInputError } from '../errors.js';
import { canTransition } from '../planner/states.js';
import type { Queryable } from './db.js';
import { toJsonTextOrNull } from './json.js';
import { claimSql, EXTEND_SQL, FINISH_SQL, RELEASE_SQL } from './lease.sql.js';
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

const claimArgs = z.object({
  owner: z.string().min(1).max(200),
  toolClass: z.string().min(1).max(200),
  limit: z.number().int().min(1).max(1000),
}).strict();

/**
 * Claims up to `limit` due stages of one tool class in one atomic statement.
 * Rows with state 'failed' are stages whose attempt budget was spent (not claimed).
 */
export async function claim(q: Queryable, args: z.input<typeof claimArgs>): Promise<ClaimedStage[]> {
  const { owner, toolClass, limit } = parseInput(claimArgs, args, 'claim');
  const sentAt = monotonicNow(); // read before asking the pool for a connection
  const rows = await q.query(claimSql(limit), [owner, toolClass], `ratchet_claim_${limit}`);
  return rows.map((r) => {
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
  });
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
}

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
  const out = await q.query(FINISH_SQL, [owner, JSON.stringify(sorted)], 'ratchet_finish');
  return out.map((r) => ({
    stageId: r.id as string,
    accepted: r.accepted as boolean,
    nextStageId: (r.next_stage_id as string | null) ?? null,
    nextToolClass: (r.next_tool_class as string | null) ?? null,
    currentState: (r.current_state as string | null) ?? null,
    currentFence: (r.current_fence as string | null) ?? null,
  }));
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
