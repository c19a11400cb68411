import { z } from 'zod';
import { InvalidDefinitionError } from '../errors.js';
import { durationSchema, positiveDurationSchema } from './duration.js';
import { brandToolClass } from './guards.js';
import { DEFAULT_RETRY_POLICY, mergeRetryPolicy, retryOptionsSchema } from './retry-policy.js';
import type { ToolClass } from './types.js';
import { definitionPath, parseDefinition } from './validate.js';

export const TOOL_CLASS_NAME = /^[a-z][a-z0-9_-]{0,63}$/i;
export const DEFAULT_MISSED_HEARTBEATS = 2;
export const DEFAULT_CLASS_JITTER_MS = 1000;

/** The options of defineToolClass, strict: an unknown key is refused, not ignored. */
export const toolClassOptionsSchema = z.strictObject({
  name: z.string().regex(TOOL_CLASS_NAME, 'must be a letter then up to 63 letters, digits, "_" or "-"'),
  /** How long one claim owns a stage without a heartbeat (the database clock); see the timing rule below. */
  lease: positiveDurationSchema,
  /** How often the worker's lease keeper extends the lease. */
  heartbeat: positiveDurationSchema,
  /**
   * The time limit of ONE CALL of the tool: its `run`, and separately its `reconcile` (each
   * gets the whole limit) — or one model call. Past it the call's `ctx.signal` aborts with
   * `timeout`, the worker stops waiting for the call and stops extending the lease, and the
   * attempt fails as a timeout (retried). Must be shorter than `maxDuration`.
   */
  timeout: positiveDurationSchema,
  /**
   * The limit of ONE ATTEMPT's whole life, from its claim: reconcile + run + the time around
   * them. Enforced by the database — past it the lease keeper's next extend itself ends the
   * attempt with `stage_duration_exceeded` (a failure counted against the attempt budget, retried
   * as the retry policy says: after its backoff, not past maxElapsed), and the tool's signal aborts
   * with that reason. Since the keeper keeps extending while each
   * call is within its `timeout`, this fires when the calls together pass it (a slow
   * reconcile, then a slow run); one call alone ends at its `timeout` first. Must be longer
   * than `timeout`: a class with `timeout >= maxDuration` is refused, with both numbers named.
   */
  maxDuration: positiveDurationSchema,
  retry: retryOptionsSchema.optional(),
  missedHeartbeats: z.int().min(1, 'must be at least 1').max(100).default(DEFAULT_MISSED_HEARTBEATS),
  jitter: durationSchema.default(DEFAULT_CLASS_JITTER_MS),
  isolation: z.enum(['none', 'thread']).default('none'),
  /** Global concurrency: stages of this class running at once across all workers. */
  concurrency: z.int().min(1).max(100_000).optional(),
  /** Rate limit across all workers: at most `max` stage starts per `per`. */
  rateLimit: z.strictObject({ max: z.int().min(1).max(1_000_000), per: positiveDurationSchema }).optional(),
});

export type ToolClassOptions = z.input<typeof toolClassOptionsSchema>;
type ParsedToolClassOptions = z.output<typeof toolClassOptionsSchema>;

/** Parsed options -> the resolved class, once: the cross-field rules live here. */
function compileToolClass(o: ParsedToolClassOptions, where: string): ToolClass {
  const numbers = {
    leaseMs: o.lease,
    heartbeatMs: o.heartbeat,
    missedHeartbeats: o.missedHeartbeats,
    jitterMs: o.jitter,
    timeoutMs: o.timeout,
    maxDurationMs: o.maxDuration,
  };
  if (o.heartbeat >= o.lease) {
    throw new InvalidDefinitionError(`heartbeat ${o.heartbeat} ms must be shorter than lease ${o.lease} ms`, `${where}.heartbeat`, numbers);
  }
  // DESIGN.md lease protocol item 5: a lease must outlive R missed heartbeats plus scheduling jitter.
  const floor = o.missedHeartbeats * o.heartbeat + o.jitter;
  if (o.lease <= floor) {
    throw new InvalidDefinitionError(
      `lease ${o.lease} ms must exceed missedHeartbeats ${o.missedHeartbeats} × heartbeat ${o.heartbeat} ms + ` +
        `jitter ${o.jitter} ms = ${floor} ms`,
      `${where}.lease`,
      { ...numbers, minimumLeaseMs: floor + 1 },
    );
  }
  // timeout limits each call; maxDuration the whole attempt (reconcile + run), so it must outlast one call.
  if (o.timeout >= o.maxDuration) {
    throw new InvalidDefinitionError(
      `timeout ${o.timeout} ms must be shorter than maxDuration ${o.maxDuration} ms: timeout limits one call (run, or reconcile), ` +
        'maxDuration the whole attempt from its claim',
      `${where}.timeout`,
      numbers,
    );
  }
  return {
    kind: 'tool_class',
    name: o.name,
    leaseMs: o.lease,
    heartbeatMs: o.heartbeat,
    timeoutMs: o.timeout,
    maxDurationMs: o.maxDuration,
    retry: mergeRetryPolicy(DEFAULT_RETRY_POLICY, o.retry, `${where}.retry`),
    missedHeartbeats: o.missedHeartbeats,
    jitterMs: o.jitter,
    isolation: o.isolation,
    concurrency: o.concurrency ?? null,
    rateLimit: o.rateLimit ? { max: o.rateLimit.max, perMs: o.rateLimit.per } : null,
  };
}

/** An operational profile shared by tools (lease, heartbeat, timeout, maxDuration, retry). */
export function defineToolClass(options: ToolClassOptions): ToolClass {
  const where = definitionPath('toolClass', (options as { name?: unknown } | null)?.name);
  const parsed = parseDefinition(toolClassOptionsSchema, options, where);
  return Object.freeze(brandToolClass(compileToolClass(parsed, where)));
}
