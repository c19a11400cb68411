/**
 * Every error Ratchet throws on purpose is a RatchetError with a stable `code`.
 * Callers match on `code` (or `instanceof`), never on message text.
 */
export const ERROR_CODES = [
  'invalid_input',
  'illegal_transition',
  'data_dir_locked',
  'database_unavailable',
  'unknown_run',
  'unknown_stage',
  'invalid_definition',
  // why an attempt stopped (ctx.signal.reason.code, and ctx.beginEffect's refusal)
  'lease_lost',
  'ownership_unknown',
  'cancelled',
  'timeout',
  'stage_duration_exceeded',
  'shutdown',
  'run_deadline',
  // the task API: a request that does not fit the run's state
  'not_retryable',
  'already_terminal',
  // waits (issue 10): a decision on a stage that another decision (or a timeout) already ended
  'already_decided',
  // a signal name no waitForSignal step of the run's workflow waits for
  'unknown_signal',
  // approve / reject of a stage that does not wait for approval (or of a run with none, or several without --stage)
  'not_awaiting_approval',
  // one Signal-Id sent again with another name or payload
  'signal_id_conflict',
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

/**
 * Codes of the errors a stage (and its run) fails with when the run graph's planner decides,
 * not the tool: stored in the stage's and the run's `error.code`.
 */
export const GRAPH_ERROR_CODES = [
  /** A step's input() threw or returned what is not JSON. */
  'step_input_failed',
  /** A step's when() threw or did not return a boolean. */
  'when_failed',
  /** A map's items() threw or did not return an array. */
  'map_items_failed',
  /** A map's list is longer than its maxItems (default 10,000). */
  'map_too_large',
  /** A map's input(item, i) threw for one item (the whole map fails: no item stage is inserted). */
  'map_item_input_failed',
  /** A child run failed, was cancelled or expired: the parent stage fails with it (its error in details). */
  'child_run_failed',
  'child_run_cancelled',
  'child_run_expired',
  /** A child-run step names a workflow (or version) this worker has not loaded. */
  'unknown_child_workflow',
  /** A child run's input does not pass the child workflow's input schema. */
  'child_input_invalid',
  /** An agent's tools failed for good more than maxToolErrors times in one run. */
  'too_many_tool_errors',
  /** Another stage of the run failed for good: this one was cancelled with it. */
  'sibling_failed',
] as const;
export type GraphErrorCode = (typeof GRAPH_ERROR_CODES)[number];

/**
 * Codes a waiting stage (issue 10) ends with when its wait ends without what it waited for:
 * stored in the stage's (and a static run's) `error.code`.
 */
export const WAIT_ERROR_CODES = [
  /** No signal within the step's timeout (and no onTimeout). */
  'signal_timeout',
  /** A step's onTimeout threw or returned what is not JSON. */
  'on_timeout_failed',
  /** A person rejected the call: an agent hears it as the tool's answer; a static run fails. */
  'approval_rejected',
  /** No decision within the tool's approvalTimeout: like a rejection, with no one's reason. */
  'approval_timeout',
  /** A sleep step's until() threw or did not return a valid Date. */
  'sleep_until_failed',
] as const;
export type WaitErrorCode = (typeof WAIT_ERROR_CODES)[number];

export class RatchetError extends Error {
  readonly code: ErrorCode;
  readonly details: Record<string, unknown>;
  constructor(code: ErrorCode, message: string, details: Record<string, unknown> = {}, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
    this.details = details;
  }
  toJSON(): { code: ErrorCode; message: string; details: Record<string, unknown> } {
    return { code: this.code, message: this.message, details: this.details };
  }
}

/** Bad input to a public entry point: nothing was written. `path` names the offending value. */
export class InvalidInputError extends RatchetError {
  constructor(
    message: string,
    readonly path: string,
    details: Record<string, unknown> = {},
  ) {
    super('invalid_input', `${message} (at ${path})`, { path, ...details });
  }
}

/** A writer asked for a state change the state table does not allow. */
export class IllegalTransitionError extends RatchetError {
  constructor(
    readonly entity: 'run' | 'stage',
    readonly from: string,
    readonly to: string,
    id?: string,
  ) {
    super('illegal_transition', `illegal ${entity} transition ${from} -> ${to}${id ? ` (${entity} ${id})` : ''}`, { entity, from, to, id });
  }
}

/** A second process tried to open an embedded data directory that another live process holds. */
export class DataDirLockedError extends RatchetError {
  constructor(
    readonly dataDir: string,
    readonly holder: string,
  ) {
    super(
      'data_dir_locked',
      `the embedded data directory ${dataDir} is in use by another process (${holder}); ` +
        `stop it, point this process at another --data-dir, or set DATABASE_URL to share a PostgreSQL server`,
      { dataDir, holder },
    );
  }
}

export class UnknownStageError extends RatchetError {
  constructor(readonly stageId: string) {
    super('unknown_stage', `no stage with id ${stageId}`, { stageId });
  }
}

export class UnknownRunError extends RatchetError {
  constructor(readonly runId: string) {
    super('unknown_run', `no run with id ${runId}`, { runId });
  }
}

/** A definition (tool class, tool, workflow) with bad values: refused before anything is persisted. */
export class InvalidDefinitionError extends RatchetError {
  constructor(
    message: string,
    readonly path: string,
    details: Record<string, unknown> = {},
  ) {
    super('invalid_definition', `${message} (at ${path})`, { path, ...details });
  }
}

/**
 * Thrown by a tool for a failure that no retry can fix (bad input, validation, a 4xx that
 * will not change): the stage fails at once, never retried.
 */
export class PermanentError extends Error {
  readonly kind = 'permanent' as const;
  readonly code: string;
  constructor(message: string, options: { code?: string; cause?: unknown } = {}) {
    super(message, { cause: options.cause });
    this.name = 'PermanentError';
    this.code = options.code ?? 'permanent';
  }
}

/** Thrown by a tool for a failure worth retrying (a timeout, a 503, a reset connection). */
export class TransientError extends Error {
  readonly kind = 'transient' as const;
  readonly code: string;
  constructor(message: string, options: { code?: string; cause?: unknown } = {}) {
    super(message, { cause: options.cause });
    this.name = 'TransientError';
    this.code = options.code ?? 'transient';
  }
}

export type AbortReason =
  | 'lease_lost'
  | 'ownership_unknown'
  | 'cancelled'
  | 'timeout'
  | 'stage_duration_exceeded'
  | 'shutdown'
  | 'run_deadline';

/**
 * Why an attempt was stopped: the reason of `ctx.signal`, and what `ctx.beginEffect()` throws
 * once ownership is lost or unknown. `lease_lost` and `ownership_unknown` are different
 * things: lost means another owner may hold the stage; unknown means we cannot tell.
 * `run_deadline`: the run's deadline passed and the run expired while the attempt ran.
 */
export class AttemptAbortedError extends RatchetError {
  constructor(
    readonly reason: AbortReason,
    message: string,
    details: Record<string, unknown> = {},
  ) {
    super(reason, message, details);
  }
}

/**
 * Retry works only from `failed` (the same run from its failed stages). An expired or cancelled
 * run is resubmitted as a new run; a queued or running run is still going (wait for it).
 */
export class RunNotRetryableError extends RatchetError {
  constructor(
    readonly runId: string,
    readonly state: string,
    readonly reason: 'not_failed' | 'no_failed_stage' | 'deadline_passed' | 'parent_ended',
    hint: string,
  ) {
    super(
      'not_retryable',
      `run ${runId} cannot be retried (${reason === 'not_failed' ? `it is ${state}` : reason.replace(/_/g, ' ')}): ${hint}`,
      { runId, state, reason },
    );
  }
}

/** Cancel of a run that already ended another way (succeeded, failed or expired): nothing changed. */
export class RunAlreadyTerminalError extends RatchetError {
  constructor(
    readonly runId: string,
    readonly state: string,
  ) {
    super('already_terminal', `run ${runId} already ended ${state}: there is nothing to cancel`, { runId, state });
  }
}

/** approve / reject of a stage whose approval was already decided (by a person, or by its timeout): 409, nothing changed. */
export class AlreadyDecidedError extends RatchetError {
  constructor(
    readonly runId: string,
    readonly stageId: string,
    decision: { outcome: string; decidedBy: string | null; decidedAt: string | null },
  ) {
    super(
      'already_decided',
      `stage ${stageId} of run ${runId} was already decided: ${decision.outcome}` +
        `${decision.decidedBy ? ` by ${decision.decidedBy}` : ''}${decision.decidedAt ? ` at ${decision.decidedAt}` : ''}`,
      { runId, stageId, ...decision },
    );
  }
}

/** A signal for a name no waitForSignal step of the run's workflow waits for: 404, nothing kept. */
export class UnknownSignalError extends RatchetError {
  constructor(
    readonly runId: string,
    readonly signal: string,
    known: readonly string[],
  ) {
    super(
      'unknown_signal',
      `run ${runId} waits for no signal named "${signal}"` +
        (known.length > 0 ? ` (its workflow waits for: ${known.join(', ')})` : ' (its workflow has no waitForSignal step)'),
      { runId, signal, known, path: 'name' },
    );
  }
}

/** approve / reject where nothing waits for approval (or several stages do and none was named): 409, nothing changed. */
export class NotAwaitingApprovalError extends RatchetError {
  constructor(
    readonly runId: string,
    readonly stageId: string | null,
    reason: string,
    details: Record<string, unknown> = {},
  ) {
    super('not_awaiting_approval', `${stageId ? `stage ${stageId} of run ${runId}` : `run ${runId}`}: ${reason}`, {
      runId,
      stageId,
      ...details,
    });
  }
}

/** One Signal-Id sent again with another name or payload: 409, nothing changed (the first delivery stands). */
export class SignalIdConflictError extends RatchetError {
  constructor(
    readonly runId: string,
    readonly signalId: string,
  ) {
    super('signal_id_conflict', `Signal-Id ${signalId} was already used on run ${runId} with another name or payload`, {
      runId,
      signalId,
      path: 'Signal-Id',
    });
  }
}

/**
 * An agent run reached its budget (tokens or cost) before its next model call: the model stage
 * and the run fail with code `budget_exceeded` (src/planner/budget.ts). Never thrown in the
 * middle of a model call: the call that crosses the budget completes and is persisted.
 */
export class BudgetExceededError extends PermanentError {
  constructor(
    message: string,
    readonly details: { reason: 'max_tokens' | 'max_cost'; limit: number; spent: number },
  ) {
    super(message, { code: 'budget_exceeded' });
    this.name = 'BudgetExceededError';
  }
}
