import { z } from 'zod';
import { InvalidDefinitionError } from '../errors.js';
import { durationSchema } from './duration.js';
import type { RetryPolicy } from './types.js';

/** The policy of a class that names none (DESIGN.md, lease protocol item 9). */
export const DEFAULT_RETRY_POLICY: RetryPolicy = Object.freeze({
  maxAttempts: 3,
  backoff: Object.freeze({ initialMs: 1000, factor: 2, maxMs: 60_000, jitter: 0.2 }),
  maxElapsedMs: null,
});

/** What authors write: every field optional, merged over a base policy. */
export const retryOptionsSchema = z.strictObject({
  maxAttempts: z.int().min(1, 'must be at least 1 (the first attempt counts)').optional(),
  backoff: z
    .strictObject({
      initial: durationSchema.optional(),
      factor: z.number().min(1, 'must be at least 1').max(1000).optional(),
      max: durationSchema.optional(),
      jitter: z.number().min(0, 'must be within 0..1').max(1, 'must be within 0..1').optional(),
    })
    .optional(),
  maxElapsed: durationSchema.nullable().optional(),
});

export type RetryOptions = z.input<typeof retryOptionsSchema>;
type ParsedRetryOptions = z.output<typeof retryOptionsSchema>;

/** `options` (already parsed) over `base`, checked as a whole, frozen. */
export function mergeRetryPolicy(base: RetryPolicy, options: ParsedRetryOptions | undefined, path: string): RetryPolicy {
  const backoff = {
    initialMs: options?.backoff?.initial ?? base.backoff.initialMs,
    factor: options?.backoff?.factor ?? base.backoff.factor,
    maxMs: options?.backoff?.max ?? base.backoff.maxMs,
    jitter: options?.backoff?.jitter ?? base.backoff.jitter,
  };
  if (backoff.maxMs < backoff.initialMs) {
    throw new InvalidDefinitionError(
      `backoff.max ${backoff.maxMs} ms must not be below backoff.initial ${backoff.initialMs} ms`,
      `${path}.backoff.max`,
      { backoff },
    );
  }
  return Object.freeze({
    maxAttempts: options?.maxAttempts ?? base.maxAttempts,
    backoff: Object.freeze(backoff),
    maxElapsedMs: options?.maxElapsed === undefined ? base.maxElapsedMs : options.maxElapsed,
  });
}
