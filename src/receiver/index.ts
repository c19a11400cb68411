/** ratchet/receiver: the fence guard for services that receive Ratchet's tool requests. */
export { createFenceGuard } from './fence-guard.js';
export type {
  EffectHandler,
  FenceGuard,
  FenceGuardOptions,
  GuardPool,
  GuardResponse,
  GuardResult,
  GuardVerdict,
  RunOptions,
} from './fence-guard.js';
export { DEFAULT_BODY_LIMIT } from './http.js';
export type { HttpHandler, HttpHandlerContext, MiddlewareOptions, RequestListener } from './http.js';
export { HandlerEndedTransactionError, InvalidFenceError, InvalidHandlerResponseError, InvalidIdempotencyKeyError } from './errors.js';
export { MAX_FENCE, MAX_FINGERPRINT_LENGTH, MAX_KEY_LENGTH, parseFence, requestFingerprint } from './fence.js';
export { DEFAULT_RECEIVER_SCHEMA } from './sql.js';
