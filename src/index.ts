/**
 * Ratchet's public API, every export by name (DESIGN.md, "Public API"): definitions, the
 * engine facade, errors, states, and the store underneath.
 */
export { defineToolClass, defineTool, defineWorkflow } from './definitions/index.js';
export { defineAgent, MODEL_STAGE_TOOL } from './definitions/agent.js';
export type { AgentOptions } from './definitions/agent.js';
export type {
  ToolClassOptions,
  ToolOptions,
  WorkflowOptions,
  StepOptions,
  ToolClass,
  Tool,
  Workflow,
  Step,
  StepInputArgs,
  ToolContext,
  ReconcileResult,
  RetryOptions,
  RetryPolicy,
  Duration,
} from './definitions/index.js';
export { defineSchedule } from './schedules/define.js';
export type { Schedule, ScheduleOptions } from './schedules/define.js';
export type { ScheduleService, ScheduleView } from './schedules/service.js';
export type { CatchUp, Overlap } from './schedules/spec.js';
export { createRatchet } from './engine.js';
export type { Ratchet, RatchetOptions, RunView, SubmitOptions } from './engine.js';
export {
  RatchetError,
  InvalidInputError,
  InvalidDefinitionError,
  IllegalTransitionError,
  DataDirLockedError,
  UnknownRunError,
  UnknownStageError,
  PermanentError,
  TransientError,
  AttemptAbortedError,
  ERROR_CODES,
} from './errors.js';
export type { ErrorCode, AbortReason } from './errors.js';
export { silentLogger, defaultLogger } from './logger.js';
export {
  STAGE_TRANSITIONS,
  RUN_TRANSITIONS,
  STAGE_STATES,
  RUN_STATES,
  TERMINAL_RUN_STATES,
  TERMINAL_STAGE_STATES,
  assertTransition,
  canTransition,
} from './planner/states.js';
export type { RunState, StageState } from './planner/states.js';
export { EVENT_TYPES } from './store/event-types.js';
export type { EventType } from './store/event-types.js';
export {
  openStore,
  DEFAULT_DATA_DIR,
  MEMORY_DATA_DIR,
  DatabaseUnavailableError,
  IdempotencyConflictError,
  LEASE_CONFIRMATION_MARGIN_MS,
} from './store/index.js';
export type {
  Store,
  StoreOptions,
  ClaimedStage,
  ExtendResult,
  ExtendVerdict,
  FinishRow,
  FinishVerdict,
  CreateRunInput,
  CreatedRun,
  RunRow,
  StageRow,
  EventRow,
  StageSpec,
} from './store/index.js';
export { RunNotRetryableError, RunAlreadyTerminalError } from './errors.js';
export { createServer } from './api/index.js';
export type { ApiServer, ServerOptions } from './api/index.js';
export type { Explanation, Verdict } from './observability/explanation.js';
export type { ListRunsFilter, RunPage, RetryResult } from './store/index.js';
