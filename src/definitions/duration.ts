import ms from 'ms';
import { z } from 'zod';
import { InvalidDefinitionError } from '../errors.js';
import type { Duration } from './types.js';

/** The longest delay `setTimeout` honours (2^31 - 1 ms, about 24.8 days); longer ones fire at once. */
export const MAX_DURATION_MS = 2 ** 31 - 1;

const EXPECTED = 'an ms string like "90s" or a whole, non-negative number of milliseconds';

function show(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'number') return String(value);
  return value === null ? 'null' : typeof value;
}

/** Milliseconds, or the reason `value` is not a usable duration. Never throws. */
export function resolveDuration(value: unknown, max = MAX_DURATION_MS): { ms: number } | { problem: string } {
  let result: number | undefined;
  if (typeof value === 'number') {
    result = value;
  } else if (typeof value === 'string') {
    try {
      result = ms(value.trim() as ms.StringValue) as number | undefined;
    } catch {
      result = undefined;
    }
    if (typeof result !== 'number') return { problem: `cannot parse duration ${show(value)}: expected ${EXPECTED}` };
  } else {
    return { problem: `expected a duration (${EXPECTED}), got ${show(value)}` };
  }
  if (!Number.isFinite(result)) return { problem: `duration ${show(value)} is not finite: expected ${EXPECTED}` };
  if (result < 0) return { problem: `duration ${show(value)} is negative: expected ${EXPECTED}` };
  if (!Number.isInteger(result)) return { problem: `duration ${show(value)} is ${result} ms, not a whole number of milliseconds` };
  if (result > max) {
    return {
      problem:
        max === MAX_DURATION_MS
          ? `duration ${show(value)} is ${result} ms, more than ${MAX_DURATION_MS} ms (2^31-1, the longest timer Node honours)`
          : `duration ${show(value)} is ${result} ms, more than ${max} ms (the longest wait)`,
    };
  }
  return { ms: result };
}

/** Parses a duration to milliseconds; a bad value is an InvalidDefinitionError at `path`. */
export function parseDuration(value: Duration, path: string): number {
  const resolved = resolveDuration(value);
  if ('problem' in resolved) throw new InvalidDefinitionError(resolved.problem, path, { value: show(value) });
  return resolved.ms;
}

/** The zod form of a duration (input: ms string or number; output: milliseconds). */
export const durationSchema = z.unknown().transform((value, ctx): number => {
  const resolved = resolveDuration(value);
  if ('problem' in resolved) {
    ctx.issues.push({ code: 'custom', message: resolved.problem, input: value });
    return z.NEVER;
  }
  return resolved.ms;
});

/** A duration that must be greater than zero (leases, heartbeats, timeouts). */
export const positiveDurationSchema = durationSchema.refine((n) => n > 0, { message: 'must be greater than 0 ms', abort: true });
