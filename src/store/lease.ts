import { performance } from 'node:perf_hooks';
import { z } from 'zod';
import type { Row } from './db.js';
import { delayMsSchema } from './validate.js';

/**
 * Timer lateness covered by the local confirmation deadline: a lease is trusted until
 * sent + (lease_until - db now) - LEASE_CONFIRMATION_MARGIN_MS, never longer.
 */
export const LEASE_CONFIRMATION_MARGIN_MS = 500;

/** The monotonic clock the confirmation deadline is measured on. */
export const monotonicNow = (): number => performance.now();

export const confirmedUntil = (sentAt: number, leaseUntil: Date, dbNow: Date): number =>
  sentAt + (leaseUntil.getTime() - dbNow.getTime()) - LEASE_CONFIRMATION_MARGIN_MS;

export interface Lease {
  stageId: string;
  fence: string;
}

/** A lease to extend, with what its retry policy says should the extend find the attempt past maxDuration. */
export interface ExtendLease extends Lease {
  /**
   * The delay before the next attempt, as the retry policy decides for this attempt failing now
   * (decideRetry with errorKind 'timeout'), or null when the policy allows none (maxElapsed spent,
   * attempts spent). Left out: the next attempt is due at once, while attempts remain.
   */
  retryDelayMs?: number | null;
}

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
  /** The run span's W3C traceparent (null: derived from the run id; src/observability/tracing.ts). */
  runTraceparent?: string | null;
  /** Monotonic time (performance.now()) until which this worker may trust the lease. */
  confirmedUntil: number;
  /** Monotonic time the claim was sent: dbNow + (monotonicNow() - sentAt) bounds the database's now from above. */
  sentAt: number;
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
    runTraceparent: (r.run_traceparent as string | null) ?? null,
    confirmedUntil: r.state === 'running' ? confirmedUntil(sentAt, leaseUntil, dbNow) : sentAt,
    sentAt,
  };
}

const leaseShape = { stageId: z.string().regex(/^\d{1,19}$/), fence: z.string().regex(/^\d{1,19}$/) };

export const leasesArgs = z
  .object({
    owner: z.string().min(1).max(200),
    leases: z.array(z.object(leaseShape).strict()).max(10_000),
  })
  .strict();

export const extendArgs = z
  .object({
    owner: z.string().min(1).max(200),
    leases: z
      .array(
        z
          .object({
            ...leaseShape,
            retryDelayMs: delayMsSchema.nullable().optional(),
          })
          .strict(),
      )
      .max(10_000),
  })
  .strict();
