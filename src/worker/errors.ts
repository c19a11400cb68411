import { ZodError } from 'zod';
import { AttemptAbortedError, BudgetExceededError, PermanentError, RatchetError, TransientError } from '../errors.js';
import type { RetryErrorKind } from '../planner/retry.js';
import { sha256Hex } from '../util/hash.js';

/** What a stage's error looks like in the database, the events and to callers. Never a stack. */
export interface StageError {
  code: string;
  message: string;
  kind: RetryErrorKind;
  name: string;
  attempt: number;
  fence: string;
  details?: unknown;
}

/** PermanentError and validation are never retried; TransientError, timeouts and the rest are. */
export function classify(err: unknown): RetryErrorKind {
  if (err instanceof PermanentError || err instanceof ZodError) return 'permanent';
  if (err instanceof TransientError) return 'transient';
  if (err instanceof AttemptAbortedError) {
    if (err.reason === 'timeout') return 'timeout';
    if (err.reason === 'cancelled') return 'cancelled';
    if (err.reason === 'lease_lost') return 'lease_lost';
    return 'unknown';
  }
  if (err instanceof RatchetError && err.code === 'invalid_input') return 'permanent';
  return 'unknown';
}

export function describeError(err: unknown, attempt: number, fence: string): StageError {
  const kind = classify(err);
  if (err instanceof ZodError) {
    return {
      code: 'invalid_output',
      message: err.issues.map((i) => `${i.path.join('.') || '$'}: ${i.message}`).join('; '),
      kind,
      name: 'ZodError',
      attempt,
      fence,
    };
  }
  if (err instanceof Error) {
    const code = (err as { code?: unknown }).code;
    const details = err instanceof RatchetError || err instanceof BudgetExceededError ? err.details : undefined;
    return {
      code: typeof code === 'string' ? code : kind === 'unknown' ? 'error' : kind,
      message: err.message.slice(0, 2000),
      kind,
      name: err.name,
      attempt,
      fence,
      ...(details && Object.keys(details).length ? { details: JSON.parse(JSON.stringify(details)) as unknown } : {}),
    };
  }
  return { code: 'thrown_value', message: String(err).slice(0, 2000), kind, name: typeof err, attempt, fence };
}

/** A payload's hash for events and logs (never the payload itself). */
export function payloadHash(value: unknown): string {
  return sha256Hex(JSON.stringify(value) ?? 'undefined').slice(0, 16);
}
