import { InvalidFenceError, InvalidIdempotencyKeyError } from './errors.js';

/** PostgreSQL bigint's upper bound: fences are taken from a sequence, so they fit. */
export const MAX_FENCE = 9223372036854775807n;
/** Longest idempotency key the guard accepts (characters). */
export const MAX_KEY_LENGTH = 512;

const DECIMAL = /^[0-9]{1,32}$/;
const CONTROL = /[\u0000-\u001f\u007f]/;

/**
 * Parses a fence (`ctx.fence`, the X-Execution-Fence header) to a BigInt. Fences are always
 * compared as BigInt, never as Number: tokens may exceed 2^53.
 */
export function parseFence(value: unknown): bigint {
  let fence: bigint;
  if (typeof value === 'bigint') fence = value;
  else if (typeof value === 'string' && DECIMAL.test(value)) fence = BigInt(value);
  else throw new InvalidFenceError(value);
  if (fence < 0n || fence > MAX_FENCE) throw new InvalidFenceError(value);
  return fence;
}

/** Checks an idempotency key: a non-empty string of at most MAX_KEY_LENGTH, no control characters. */
export function assertIdempotencyKey(value: unknown): asserts value is string {
  if (typeof value !== 'string') throw new InvalidIdempotencyKeyError('not a string', value);
  if (value.length === 0) throw new InvalidIdempotencyKeyError('empty', value);
  if (value.length > MAX_KEY_LENGTH) throw new InvalidIdempotencyKeyError(`longer than ${MAX_KEY_LENGTH} characters`, value);
  if (CONTROL.test(value)) throw new InvalidIdempotencyKeyError('contains control characters', value);
}
