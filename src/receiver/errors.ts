import { InvalidInputError } from '../errors.js';

/**
 * Bad use of the receiver guard. Each is an InvalidInputError (code `invalid_input`), so
 * callers match on `code` or `instanceof`; `path` names the offending value. Nothing was
 * written when one of these is thrown before the guard's transaction began.
 */

function preview(value: unknown): string {
  const s = typeof value === 'string' ? value : typeof value === 'bigint' ? `${value}n` : String(value);
  return s.length > 64 ? `${s.slice(0, 64)}…` : s;
}

/** A fence that is not a decimal integer in 0 ..= 2^63-1 (PostgreSQL bigint). */
export class InvalidFenceError extends InvalidInputError {
  constructor(readonly value: unknown) {
    super('a fence must be a decimal integer string (or bigint) between 0 and 9223372036854775807', 'fence', {
      value: preview(value),
    });
  }
}

/** An idempotency key that is empty, too long, or holds control characters. */
export class InvalidIdempotencyKeyError extends InvalidInputError {
  constructor(reason: string, readonly value: unknown) {
    super(`invalid idempotency key: ${reason}`, 'idempotencyKey', { value: preview(value) });
  }
}

/** A handler answered something the guard cannot store or send (bad status, body not JSON). */
export class InvalidHandlerResponseError extends InvalidInputError {
  constructor(reason: string, options?: { cause?: unknown }) {
    super(`the effect handler's response is invalid: ${reason}`, 'response');
    if (options?.cause !== undefined) Object.defineProperty(this, 'cause', { value: options.cause, enumerable: false });
  }
}
