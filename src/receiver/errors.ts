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
  constructor(
    reason: string,
    readonly value: unknown,
  ) {
    super(`invalid idempotency key: ${reason}`, 'idempotencyKey', { value: preview(value) });
  }
}

/** A handler answered something the guard cannot store or send (bad status, body not JSON). */
export class InvalidHandlerResponseError extends InvalidInputError {
  constructor(reason: string, options?: { cause?: unknown; path?: string }) {
    super(`the effect handler's response is invalid: ${reason}`, options?.path ?? 'response');
    if (options?.cause !== undefined) Object.defineProperty(this, 'cause', { value: options.cause, enumerable: false });
  }
}

/**
 * The handler ended the guard's transaction itself (COMMIT, ROLLBACK, or BEGIN of another).
 * The guard's commit check refused the commit, so the handler's writes in that transaction
 * were not kept and no response was stored; a retry runs the handler again. Write through
 * `tx` and leave COMMIT and ROLLBACK to the guard.
 */
export class HandlerEndedTransactionError extends InvalidInputError {
  constructor(options?: { cause?: unknown }) {
    super(
      "the effect handler ended the guard's transaction (COMMIT or ROLLBACK on tx): its writes were not kept, " +
        'nothing was stored; write through tx and let the guard commit',
      'handler',
    );
    if (options?.cause !== undefined) Object.defineProperty(this, 'cause', { value: options.cause, enumerable: false });
  }
}
