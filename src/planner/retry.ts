import type { RetryPolicy } from '../definitions/types.js';

/** The longest delay a timer honours (2^31 - 1 ms). */
const MAX_DELAY_MS = 2 ** 31 - 1;

export type RetryErrorKind = 'permanent' | 'transient' | 'timeout' | 'lease_lost' | 'cancelled' | 'unknown';

export type RetryDecision =
  | { retry: true; delayMs: number }
  | { retry: false; reason: 'permanent' | 'attempts_exhausted' | 'max_elapsed' | 'cancelled' };

/**
 * The delay before the attempt after `attempt` (1-based): min(max, initial × factor^(attempt−1)),
 * scaled by (1 − jitter × random()) so it falls in [d × (1 − jitter), d]; whole ms, within timer range.
 */
export function retryDelayMs(policy: RetryPolicy, attempt: number, random: () => number = Math.random): number {
  const { initialMs, factor, maxMs, jitter } = policy.backoff;
  const n = Math.max(1, Math.floor(attempt));
  const base = Math.min(maxMs, initialMs * factor ** (n - 1));
  const r = Math.min(1, Math.max(0, random()));
  const delay = Math.round(base * (1 - jitter * r));
  return Math.min(MAX_DELAY_MS, Math.max(0, delay));
}

export interface RetryQuestion {
  policy: RetryPolicy;
  /** The attempt that just failed (1-based). */
  attempt: number;
  errorKind: RetryErrorKind;
  /** Time since the stage's first claim. */
  elapsedMs: number;
  random?: () => number;
}

/** Whether a failed attempt gets another, and after how long (DESIGN.md lease protocol item 9). */
export function decideRetry({ policy, attempt, errorKind, elapsedMs, random }: RetryQuestion): RetryDecision {
  if (errorKind === 'cancelled') return { retry: false, reason: 'cancelled' };
  if (errorKind === 'permanent') return { retry: false, reason: 'permanent' };
  if (attempt >= policy.maxAttempts) return { retry: false, reason: 'attempts_exhausted' };
  const delayMs = retryDelayMs(policy, attempt, random);
  if (policy.maxElapsedMs !== null && elapsedMs + delayMs > policy.maxElapsedMs) return { retry: false, reason: 'max_elapsed' };
  return { retry: true, delayMs };
}
