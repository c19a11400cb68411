import { RatchetError } from '../errors.js';

/**
 * The database did not answer (refused, reset, timed out). For a lease statement this means
 * ownership is *unknown*, never lost: only a missing row means lost.
 */
export class DatabaseUnavailableError extends RatchetError {
  constructor(cause: unknown) {
    super('database_unavailable', `database unavailable: ${cause instanceof Error ? cause.message : String(cause)}`, {}, { cause });
  }
}

const CONNECTION_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENOTFOUND', 'EAI_AGAIN', '57P01', '57P02', '57P03', '08000', '08001', '08003', '08004', '08006']);

export function isConnectionError(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const code = (err as { code?: string }).code;
  if (code && CONNECTION_CODES.has(code)) return true;
  return /Connection terminated|connection timeout|timeout exceeded when trying to connect|Client has encountered a connection error|not queryable|Query read timeout/i.test(err.message);
}
