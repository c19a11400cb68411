/** The task API: the HTTP server, its schemas and errors (DESIGN.md "Task API"). */
export { createServer, DEFAULT_API_HOST, DEFAULT_API_PORT, DEFAULT_BODY_LIMIT, DEFAULT_RETRY_AFTER_SECONDS } from './server.js';
export type { ApiServer, ServerOptions } from './server.js';
export { createApp } from './app.js';
export { createRunService } from './service.js';
export type { RunService } from './service.js';
export { ApiError, API_ERROR_CODES, errorBodySchema, hasCode } from './errors.js';
export type { ApiErrorCode, ErrorBody } from './errors.js';
export * from './schemas.js';
