import type { GraphErrorCode, WaitErrorCode } from '../errors.js';

/** An error the planner decides (no tool involved): permanent, never retried. */
export interface PlannerError {
  /** A graph decision's code, or a wait's (issue 10: signal_timeout, sleep_until_failed, ...). */
  code: GraphErrorCode | WaitErrorCode;
  message: string;
  kind: 'permanent';
  details?: Record<string, unknown>;
}

export interface PlannerFailure {
  kind: 'fail';
  error: PlannerError;
}

export function plannerFailure(code: GraphErrorCode, message: string, details?: Record<string, unknown>): PlannerFailure {
  return { kind: 'fail', error: { code, message, kind: 'permanent', ...(details ? { details } : {}) } };
}

/** Runs user code of a step (input, when, items): a throw is that step's permanent failure with `code`. */
export function guarded<T>(code: GraphErrorCode, what: string, fn: () => T): { ok: true; value: T } | { ok: false; fail: PlannerFailure } {
  try {
    return { ok: true, value: fn() };
  } catch (err) {
    return { ok: false, fail: plannerFailure(code, `${what} threw: ${err instanceof Error ? err.message : String(err)}`) };
  }
}
