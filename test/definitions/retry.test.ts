import { describe, expect, it } from 'vitest';
import type { RetryPolicy } from '../../src/definitions/index.js';
import { decideRetry, retryDelayMs, type RetryErrorKind } from '../../src/planner/retry.js';

const policy: RetryPolicy = { maxAttempts: 10, backoff: { initialMs: 1000, factor: 2, maxMs: 60_000, jitter: 0.2 }, maxElapsedMs: null };
const noJitter = () => 0;

describe('retryDelayMs', () => {
  it('doubles from initial and caps at max (1s, 2s, 4s, ... 60s)', () => {
    const delays = [1, 2, 3, 4, 5, 6, 7, 8].map((attempt) => retryDelayMs(policy, attempt, noJitter));
    expect(delays).toEqual([1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000]);
  });

  it('draws within [d × (1 − jitter), d]', () => {
    expect(retryDelayMs(policy, 1, () => 1)).toBe(800);
    expect(retryDelayMs(policy, 1, () => 0.5)).toBe(900);
    expect(retryDelayMs(policy, 3, () => 0.999999)).toBe(3200);
    for (let i = 0; i < 200; i++) {
      const d = retryDelayMs(policy, 2);
      expect(d).toBeGreaterThanOrEqual(1600);
      expect(d).toBeLessThanOrEqual(2000);
    }
  });

  it('rounds to whole ms and stays within the timer range', () => {
    expect(Number.isInteger(retryDelayMs({ ...policy, backoff: { ...policy.backoff, initialMs: 333 } }, 1, () => 0.37))).toBe(true);
    const huge: RetryPolicy = { ...policy, backoff: { initialMs: 2 ** 30, factor: 10, maxMs: Number.MAX_SAFE_INTEGER, jitter: 0 } };
    expect(retryDelayMs(huge, 50)).toBe(2 ** 31 - 1);
  });

  it('treats attempts below 1 as the first', () => expect(retryDelayMs(policy, 0, noJitter)).toBe(1000));
});

describe('decideRetry', () => {
  const ask = (over: Partial<Parameters<typeof decideRetry>[0]> = {}) =>
    decideRetry({ policy, attempt: 1, errorKind: 'transient', elapsedMs: 0, random: noJitter, ...over });

  it('never retries a permanent error, whatever the budget', () => {
    expect(ask({ errorKind: 'permanent' })).toEqual({ retry: false, reason: 'permanent' });
  });

  it('never retries a cancelled attempt', () => {
    expect(ask({ errorKind: 'cancelled' })).toEqual({ retry: false, reason: 'cancelled' });
  });

  for (const errorKind of ['transient', 'timeout', 'lease_lost', 'unknown'] as RetryErrorKind[]) {
    it(`retries ${errorKind} with the backoff delay`, () => {
      expect(ask({ errorKind, attempt: 3 })).toEqual({ retry: true, delayMs: 4000 });
    });
  }

  it('stops when the attempts are exhausted', () => {
    const three = { ...policy, maxAttempts: 3 };
    expect(ask({ policy: three, attempt: 2 })).toEqual({ retry: true, delayMs: 2000 });
    expect(ask({ policy: three, attempt: 3 })).toEqual({ retry: false, reason: 'attempts_exhausted' });
    expect(ask({ policy: three, attempt: 4 })).toEqual({ retry: false, reason: 'attempts_exhausted' });
    expect(ask({ policy: { ...policy, maxAttempts: 1 } })).toEqual({ retry: false, reason: 'attempts_exhausted' });
  });

  it('stops when the next attempt would start past maxElapsed', () => {
    const bounded = { ...policy, maxElapsedMs: 10_000 };
    expect(ask({ policy: bounded, attempt: 2, elapsedMs: 8000 })).toEqual({ retry: true, delayMs: 2000 });
    expect(ask({ policy: bounded, attempt: 2, elapsedMs: 8001 })).toEqual({ retry: false, reason: 'max_elapsed' });
    // The jittered delay is the one compared.
    expect(ask({ policy: bounded, attempt: 2, elapsedMs: 8300, random: () => 1 })).toEqual({ retry: true, delayMs: 1600 });
  });

  it('checks permanent before exhaustion', () => {
    expect(ask({ errorKind: 'permanent', attempt: 99 })).toEqual({ retry: false, reason: 'permanent' });
  });
});
