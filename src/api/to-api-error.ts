import { HTTPException } from 'hono/http-exception';
import { RatchetError } from '../errors.js';
import { DatabaseUnavailableError, IdempotencyConflictError } from '../store/index.js';
import { classifyDbError, isConnectionError } from '../store/db-errors.js';
import { ApiError } from './errors.js';

/**
 * Any error a handler meets -> the ApiError the client sees. The database not answering is a
 * 503 `database_unavailable` (with Retry-After), never a 500 and never a success; an error we
 * did not plan for is a 500 `internal` whose message says nothing about inputs.
 */
export function toApiError(err: unknown, retryAfterSeconds: number): ApiError {
  if (err instanceof ApiError) return err;
  if (err instanceof DatabaseUnavailableError || isConnectionError(err)) {
    return new ApiError(
      503,
      'database_unavailable',
      'the database did not answer; nothing was changed by this request unless a later read shows it (retry with the same Idempotency-Key)',
      {
        retryAfterMs: retryAfterSeconds * 1000,
        cause: err,
      },
    );
  }
  if (classifyDbError(err) === 'conflict') {
    // 40P01 / 40001: the database rolled the whole transaction back (a deadlock with the sweeper or a
    // cancel, a serialisation failure); nothing was written. Retryable at once: 503 with Retry-After.
    return new ApiError(
      503,
      'transaction_conflict',
      'the request met a concurrent change and was rolled back; nothing was changed: retry it',
      {
        retryAfterMs: 1000,
        details: { sqlstate: (err as { code?: string }).code ?? null },
        cause: err,
      },
    );
  }
  if (err instanceof IdempotencyConflictError) {
    return new ApiError(409, 'idempotency_conflict', err.message, { path: 'Idempotency-Key', details: { runId: err.runId }, cause: err });
  }
  if (err instanceof RatchetError) {
    const path = typeof err.details.path === 'string' ? err.details.path : null;
    const { issues, ...details } = err.details;
    const withIssues = Array.isArray(issues) ? { ...details, issues } : details;
    switch (err.code) {
      case 'invalid_input':
        if (err.details.reason === 'unknown_workflow')
          return new ApiError(404, 'unknown_workflow', err.message, { path: 'workflow', details: withIssues, cause: err });
        return new ApiError(422, 'invalid_input', err.message, { path, details: withIssues, cause: err });
      case 'invalid_definition':
        return new ApiError(422, 'invalid_input', err.message, { path, details: withIssues, cause: err });
      case 'unknown_run':
        return new ApiError(404, 'unknown_run', err.message, { details: err.details, cause: err });
      case 'not_retryable':
        return new ApiError(409, 'not_retryable', err.message, { details: err.details, cause: err });
      case 'already_terminal':
        return new ApiError(409, 'already_terminal', err.message, { details: err.details, cause: err });
      case 'unknown_stage':
        return new ApiError(404, 'unknown_stage', err.message, { path: 'stageId', details: err.details, cause: err });
      case 'unknown_signal':
        return new ApiError(404, 'unknown_signal', err.message, { path: 'name', details: withIssues, cause: err });
      case 'already_decided':
      case 'not_awaiting_approval':
        return new ApiError(409, err.code, err.message, { details: err.details, cause: err });
      case 'signal_id_conflict':
        return new ApiError(409, 'signal_id_conflict', err.message, { path: 'Signal-Id', details: withIssues, cause: err });
      case 'database_unavailable':
        return toApiError(new DatabaseUnavailableError(err), retryAfterSeconds);
      default:
        break;
    }
  }
  if (err instanceof HTTPException) {
    const status = err.status;
    if (status === 413)
      return new ApiError(413, 'body_too_large', err.message || 'the request body is too large', { path: '$', cause: err });
    if (status === 415) return new ApiError(415, 'unsupported_media_type', 'send the body as application/json', { path: '$', cause: err });
    if (status === 400) return new ApiError(400, 'invalid_json', `the body is not JSON: ${err.message}`, { path: '$', cause: err });
    if (status === 401) return new ApiError(401, 'unauthorized', err.message, { cause: err });
  }
  return new ApiError(500, 'internal', 'internal error (logged on the server)', { cause: err });
}
