import { createHash } from 'node:crypto';
import { InvalidInputError } from '../errors.js';
import { PG_BIGINT_MAX } from '../store/validate.js';
import { InvalidFenceError, InvalidIdempotencyKeyError } from './errors.js';

/** PostgreSQL bigint's upper bound: fences are taken from a sequence, so they fit. */
export const MAX_FENCE = PG_BIGINT_MAX;
/** Longest idempotency key the guard accepts (characters). */
export const MAX_KEY_LENGTH = 512;

/** Longest request fingerprint the guard stores (characters; a SHA-256 hex digest is 64). */
export const MAX_FINGERPRINT_LENGTH = 256;

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

/** Checks a request fingerprint: a non-empty string of at most MAX_FINGERPRINT_LENGTH, no control characters. */
export function assertFingerprint(value: unknown): asserts value is string | undefined {
  if (value === undefined) return;
  if (typeof value !== 'string' || value.length === 0 || value.length > MAX_FINGERPRINT_LENGTH || CONTROL.test(value)) {
    const message = `a request fingerprint must be a string of 1..${MAX_FINGERPRINT_LENGTH} characters without control characters`;
    throw new InvalidInputError(message, 'fingerprint', { type: typeof value });
  }
}

/**
 * The fingerprint of an HTTP request: SHA-256 (hex) over its method, its target (path and
 * query, as sent) and its body bytes, exactly as received. Byte-exact on purpose: two bodies
 * that parse to the same JSON but differ in bytes (key order, a number's digits) are
 * different requests, so a client must resend the same bytes under one key.
 */
export function requestFingerprint(method: string, target: string, body: Uint8Array | string): string {
  return createHash('sha256').update(method.toUpperCase()).update('\u0000').update(target).update('\u0000').update(body).digest('hex');
}
