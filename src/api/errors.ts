import { z } from 'zod';
import { RatchetError } from '../errors.js';

/**
 * The task API's error codes: stable, one per reason, the same in the HTTP body, the client's
 * thrown error and the CLI's --json. The first group comes from the server; the last three are
 * the client's own (a read that timed out, a network error, an answer that does not fit).
 */
export const API_ERROR_CODES = [
  'unauthorized',
  'forbidden_host',
  'invalid_json',
  'invalid_request',
  'unsupported_media_type',
  'body_too_large',
  'invalid_input',
  'unknown_workflow',
  'unknown_run',
  'unknown_schedule',
  'idempotency_conflict',
  'not_retryable',
  'already_terminal',
  'unknown_stage',
  'unknown_signal',
  'already_decided',
  'not_awaiting_approval',
  'signal_id_conflict',
  'not_found',
  'database_unavailable',
  'transaction_conflict',
  'internal',
  'read_timeout',
  'network_error',
  'invalid_response',
] as const;
export type ApiErrorCode = (typeof API_ERROR_CODES)[number];

export const errorBodySchema = z
  .object({
    error: z
      .object({
        code: z.enum(API_ERROR_CODES),
        message: z.string(),
        /** The JSON path of the offending value (`input.invoiceId`, `workflow`), when there is one. */
        path: z.string().nullable(),
        details: z.record(z.string(), z.unknown()),
      })
      .strict(),
  })
  .strict()
  .meta({ id: 'Error' });
export type ErrorBody = z.infer<typeof errorBodySchema>;

/** An error of the task API: HTTP status, stable code, JSON path, details. Thrown by the client too. */
export class ApiError extends Error {
  readonly status: number;
  readonly code: ApiErrorCode;
  readonly path: string | null;
  readonly details: Record<string, unknown>;
  /** From Retry-After, when the server sent one (503). */
  readonly retryAfterMs: number | null;
  constructor(
    status: number,
    code: ApiErrorCode,
    message: string,
    opts: { path?: string | null; details?: Record<string, unknown>; retryAfterMs?: number | null; cause?: unknown } = {},
  ) {
    super(message, { cause: opts.cause });
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.path = opts.path ?? null;
    this.details = opts.details ?? {};
    this.retryAfterMs = opts.retryAfterMs ?? null;
  }
  toJSON(): ErrorBody {
    return { error: { code: this.code, message: this.message, path: this.path, details: this.details } };
  }
}

/** Is this a RatchetError (engine) or ApiError (client) with this code? */
export function hasCode(err: unknown, code: string): boolean {
  return (err instanceof RatchetError || err instanceof ApiError) && err.code === code;
}

/** A zod failure as one path string: `input.items[2].sku`; unrecognised keys name the key. */
export function issuePath(issue: z.core.$ZodIssue, prefix: string[] = []): string {
  const parts = [...prefix, ...issue.path.map((p) => (typeof p === 'number' ? `[${p}]` : String(p)))];
  if (issue.code === 'unrecognized_keys' && issue.keys[0]) parts.push(issue.keys[0]);
  return parts.join('.').replace(/\.\[/g, '[') || '$';
}
